"""Ollama's API: POST /api/generate and /api/chat (NDJSON streams, streamed by default),
GET /api/tags, POST /api/show, GET /api/ps, GET /api/version, as the official clients
call them.

Ollama's conventions kept: a generate request without a prompt (a chat without messages)
loads the model and answers `done_reason: "load"` at once, and with `keep_alive` 0
`"unload"`; `tools` on /api/chat work as on /v1/chat/completions (core.protocol.tools),
the calls coming back as `message.tool_calls` with their arguments as objects.

What differs from Ollama, on purpose: the one served model answers (another name is a
404, as on the OpenAI routes) and stays loaded: an unload request unloads nothing, and
/api/ps lists the model as Ollama lists one kept with `keep_alive: -1`; `images` and
`suffix` get a clear 400; `repeat_penalty` defaults to 1.0 (onnxruntime-genai penalizes
the whole sequence, where Ollama's 1.1 looks at the last 64 tokens); Ollama's other
options (`num_ctx`, `mirostat`, ...) and fields (`template`, `context`, `logprobs`) are
accepted and not used, and any other field is a 400 (core.protocol.Body).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema

from ortserve.core import version as ortserve_version
from ortserve.core.durations import GO_DURATION, NS, nanoseconds
from ortserve.core.errors import InvalidRequestError, ModelNotFoundError, OrtServeError
from ortserve.core.generation import (
    Completion,
    GenerationRequest,
    Guidance,
    SamplingOptions,
    TokenLogprob,
)
from ortserve.core.http import Request, Response, json_response
from ortserve.core.protocol.bodies import (
    NO_IMAGES,
    REPETITION_PENALTY_DOC,
    SEED,
    SPECULATIVE_DOC,
    TEMPERATURE_DOC,
    TOP_K_DOC,
    TOP_P_DOC,
    Body,
    GenerationBody,
    JsonSchema,
    Seed,
    Stop,
    TopK,
    integral,
    json_guidance,
    parse,
)
from ortserve.core.protocol.replies import (
    OllamaAssistantMessage,
    OllamaDetails,
    OllamaLine,
    OllamaModel,
    OllamaPs,
    OllamaRunning,
    OllamaShow,
    OllamaTags,
    OllamaVersion,
)
from ortserve.core.protocol.serving import Reply, Served, public_finish
from ortserve.core.protocol.tools import MAX_TOOLS, Tool, ToolCall, ToolPlan, plan_tools
from ortserve.core.settings import DEFAULT_NEW_TOKENS, MAX_TOKENS_BOUND

if TYPE_CHECKING:  # core.api imports core.routes, which imports this module
    from ortserve.core.api import Api, Context

_NOT_SUPPORTED = "not supported by ortserve"
#: `keep_alive`: seconds, or a Go duration string; negative: for good.
KeepAlive = (
    Annotated[float, Field(allow_inf_nan=False)] | Annotated[str, Field(pattern=GO_DURATION)]
)
#: When Ollama says a model kept with `keep_alive` -1 expires: Go's longest duration away.
_FOREVER = timedelta(microseconds=(2**63 - 1) // 1000)
# Execution providers whose model lives in GPU memory (Ollama's `size_vram`).
_GPU_PROVIDERS = frozenset({"cuda", "dml", "webgpu"})


def _no_images(images: list[str]) -> list[str]:
    if images:
        raise ValueError(NO_IMAGES)
    return images


#: `images`: none (the schema says so), and in words a user understands when some come.
NoImages = Annotated[
    list[str],
    WithJsonSchema({"type": "array", "items": {"type": "string"}, "maxItems": 0}),
    AfterValidator(_no_images),
]
_IMAGES_DOC = f"none: {NO_IMAGES}"


def unloads(keep_alive: float | str | None) -> bool:
    """Whether `keep_alive` is Ollama's 0 (unload now): seconds, or a duration string,
    that come to under a nanosecond (Ollama truncates to whole nanoseconds)."""
    return keep_alive is not None and nanoseconds(keep_alive) == 0


class OllamaOptions(Body):
    """`options`: the sampling parameters ortserve has (left out: the model's defaults);
    Ollama's others are accepted, not used."""

    accepted = frozenset(
        {
            "numa",
            "num_ctx",
            "num_batch",
            "num_gpu",
            "main_gpu",
            "low_vram",
            "f16_kv",
            "logits_all",
            "vocab_only",
            "use_mmap",
            "use_mlock",
            "embedding_only",
            "num_thread",
            "num_keep",
            "tfs_z",
            "typical_p",
            "min_p",
            "repeat_last_n",
            "presence_penalty",
            "frequency_penalty",
            "mirostat",
            "mirostat_tau",
            "mirostat_eta",
            "penalize_newline",
        }
    )

    temperature: float | None = Field(default=None, ge=0.0, le=2.0, description=TEMPERATURE_DOC)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, description=TOP_P_DOC)
    top_k: TopK | None = Field(default=None, description=TOP_K_DOC)
    num_predict: Annotated[int, Field(ge=-2, le=MAX_TOKENS_BOUND), BeforeValidator(integral)] = (
        Field(
            default=-1,
            description=f"-1 or -2: the server's default ({DEFAULT_NEW_TOKENS}, or "
            "MAX_NEW_TOKENS if set); more than fits after the prompt is cut to the context",
        )
    )
    repeat_penalty: float | None = Field(
        default=None, gt=0.0, le=2.0, description=REPETITION_PENALTY_DOC
    )
    seed: Seed | None = SEED
    stop: Stop = None
    speculative: bool = Field(default=True, description=SPECULATIVE_DOC)


def model_not_found(name: str, served: Served) -> ModelNotFoundError:
    """Ollama's 404 for a model this server does not have."""
    return ModelNotFoundError(f"model '{name}' not found; this server has '{served.model}'")


class _OllamaBody(GenerationBody):
    # Sent by Ollama's clients when asked; ortserve has no log probabilities here.
    accepted = frozenset({"logprobs", "top_logprobs"})

    # Any of the served model's names, or "" (the one model; Ollama asks for one).
    model: str
    format: Literal["json"] | JsonSchema | None = Field(
        default=None, description='"json", or a JSON schema the output must match'
    )
    options: OllamaOptions = Field(default_factory=OllamaOptions)
    stream: bool = True
    think: bool | None = Field(
        default=None, description="the template's thinking switch (enable_thinking)"
    )
    keep_alive: KeepAlive | None = Field(
        default=None,
        description="accepted; the model stays loaded (0 with no prompt or messages "
        "answers done_reason unload)",
    )

    def _served_model(self, served: Served) -> None:
        if served.named(self.model) is None:
            raise model_not_found(self.model, served)

    def _instant(self, served: Served, text_field: Literal["response", "message"]) -> OllamaLine:
        """Ollama's answer to a load (or unload) request: its options are checked as a
        generation's would be (the document bounds `num_predict` by the server's limit).

        Raises:
            InvalidRequestError: `num_predict` above MAX_NEW_TOKENS, where it is set.
        """
        self._served_model(served)
        wanted = self.options.num_predict
        if served.limit_set and wanted > served.max_new_tokens:
            raise InvalidRequestError(
                f"num_predict {wanted} is above this server's limit of {served.max_new_tokens}",
                "options.num_predict",
            )
        return OllamaReply(served.answering(self.model), text_field).instant(
            "unload" if unloads(self.keep_alive) else "load"
        )

    def _options(self, served: Served) -> SamplingOptions:
        self._served_model(served)
        o = self.options
        limit = o.num_predict if o.num_predict > 0 else served.default_new_tokens
        return SamplingOptions(
            max_new_tokens=limit,
            temperature=o.temperature,
            top_p=o.top_p,
            top_k=o.top_k,
            repetition_penalty=o.repeat_penalty,
            seed=o.seed,
            speculative=o.speculative,
            adapter=served.adapter_of(self.model),
        )

    def _guidance(self) -> Guidance | None:
        if self.format is None:
            return None
        schema = {"type": "object"} if self.format == "json" else self.format
        return json_guidance(schema, "format")

    def _template_kwargs(self) -> dict[str, Any] | None:
        return None if self.think is None else {"enable_thinking": self.think}

    def _request(self, served: Served, **text: Any) -> GenerationRequest:
        """The generation of `text` (a prompt, or messages and their template's inputs)."""
        return GenerationRequest(
            **text,
            options=self._options(served),
            stop=tuple(self.options.stop or ()),
            guidance=self._guidance(),
            limit_field="options.num_predict",
        )


class OllamaGenerateBody(_OllamaBody):
    """POST /api/generate: the prompt goes through the model's chat template as a user
    turn (after `system`), unless `raw` is true or the model has no template. No prompt:
    load the model (Ollama's convention)."""

    # Ollama's template override and old-style context: accepted, not used.
    accepted = _OllamaBody.accepted | {"template", "context"}

    prompt: str = Field(default="", description="none: load the model")
    system: str | None = None
    raw: bool = False
    images: NoImages | None = Field(default=None, description=_IMAGES_DOC)
    suffix: Literal[""] | None = Field(default=None, description=_NOT_SUPPORTED)

    def instant_answer(self, served: Served) -> OllamaLine | None:
        return None if self.prompt else self._instant(served, "response")

    def to_generation(self, served: Served) -> GenerationRequest:
        if self.raw or served.chat_template is None:
            return self._request(served, prompt=self.prompt)
        messages = [{"role": "user", "content": self.prompt}]
        if self.system:
            messages.insert(0, {"role": "system", "content": self.system})
        return self._request(served, messages=messages, template_kwargs=self._template_kwargs())

    def reply(self, request_id: str, served: Served) -> Reply:
        return OllamaReply(served.answering(self.model), "response")


class OllamaFunctionCall(Body):
    """The function an assistant turn called, with its arguments."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class OllamaToolCall(Body):
    """One of an assistant turn's `tool_calls`."""

    function: OllamaFunctionCall


class OllamaMessage(Body):
    """One chat message."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None
    tool_name: str | None = Field(default=None, description="a tool result's function")
    tool_calls: list[OllamaToolCall] | None = Field(
        default=None, description="an assistant turn's calls (sent back with the results)"
    )
    images: NoImages | None = Field(default=None, description=_IMAGES_DOC)

    def as_template_input(self) -> dict[str, Any]:
        """The message as chat templates expect it (`thinking` as reasoning_content, a
        tool result's function as its name, calls as OpenAI's)."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.thinking is not None:
            message["reasoning_content"] = self.thinking
        if self.tool_name is not None:
            message["name"] = self.tool_name
        if self.tool_calls:
            message["tool_calls"] = [
                {"type": "function", "function": c.function.model_dump()} for c in self.tool_calls
            ]
        return message


class OllamaChatBody(_OllamaBody):
    """POST /api/chat. No messages: load the model (Ollama's convention)."""

    messages: list[OllamaMessage] = Field(default_factory=list, description="none: load the model")
    tools: list[Tool] | None = Field(
        default=None,
        max_length=MAX_TOOLS,
        description="functions the model may call, as on /v1/chat/completions; its calls "
        "come back as message.tool_calls",
    )

    def instant_answer(self, served: Served) -> OllamaLine | None:
        return None if self.messages else self._instant(served, "message")

    def _tools(self, served: Served) -> ToolPlan | None:
        return plan_tools(self.tools, "auto", served) if self.tools else None

    def to_generation(self, served: Served) -> GenerationRequest:
        messages = [m.as_template_input() for m in self.messages]
        plan = self._tools(served)
        if plan is not None:
            messages = plan.messages(messages)
        return self._request(
            served,
            messages=messages,
            template_kwargs=self._template_kwargs(),
            tools=plan.template_tools() if plan is not None else None,
        )

    def reply(self, request_id: str, served: Served) -> Reply:
        return OllamaReply(served.answering(self.model), "message", self._tools(served))


class OllamaReply(Reply):
    """Ollama's answer: NDJSON lines of `{model, created_at, response | message, done}`,
    the last with `done: true`, `done_reason` and the counts and durations (ns). With
    tools, the text is read for calls once it is whole: a stream holds it back and sends
    the calls (or the text) in one line before the last."""

    framing = "ndjson"
    done_marker = False

    def __init__(
        self,
        model: str,
        text_field: Literal["response", "message"],
        tools: ToolPlan | None = None,
    ) -> None:
        self.model = model
        self.text_field = text_field
        self.tools = tools

    def _line(self, text: str, done: bool, calls: list[ToolCall] | None = None) -> OllamaLine:
        created = _now()
        if self.text_field == "response":
            return {"model": self.model, "created_at": created, "response": text, "done": done}
        message: OllamaAssistantMessage = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [c.as_ollama() for c in calls]
        return {"model": self.model, "created_at": created, "message": message, "done": done}

    def instant(self, reason: Literal["load", "unload"]) -> OllamaLine:
        """The answer to a load or unload request."""
        line = self._line("", True)
        line["done_reason"] = reason
        return line

    @staticmethod
    def _last(line: OllamaLine, done: Completion) -> OllamaLine:
        """`line` with the answer's reason, counts and durations (the last line)."""
        timings = done.timings
        line["done_reason"] = public_finish(done)
        line["total_duration"] = round((timings.ttft_s + timings.decode_s) * NS)
        line["load_duration"] = 0
        line["prompt_eval_count"] = done.prompt_tokens  # cached ones included, as Ollama's
        if done.cached_tokens:  # Ollama's field is there only when some were (omitempty)
            line["prompt_eval_cached_count"] = done.cached_tokens
        line["prompt_eval_duration"] = round(timings.ttft_s * NS)
        line["eval_count"] = done.completion_tokens
        line["eval_duration"] = round(timings.decode_s * NS)
        return line

    def delta(self, text: str, logprobs: list[TokenLogprob] | None = None) -> OllamaLine | None:
        if self.tools is not None:
            return None  # held back until the whole text says whether it is a call
        return self._line(text, False)

    def final_events(self, done: Completion) -> list[OllamaLine]:
        last = self._last(self._line("", True), done)
        if self.tools is None:
            return [last]
        calls = self.tools.parse(done.text)
        if not calls and not done.text:
            return [last]
        return [self._line("" if calls else done.text, False, calls), last]

    def body(self, done: Completion) -> OllamaLine:
        calls = self.tools.parse(done.text) if self.tools is not None else []
        return self._last(self._line("" if calls else done.text, True, calls), done)

    def error_event(self, exc: OrtServeError) -> dict[str, str]:
        return {"error": exc.message}


class OllamaShowBody(Body):
    """POST /api/show (`name` is the old spelling of `model`)."""

    model: str | None = None
    name: str | None = None


# -- the routes' answers (core.routes) ---------------------------------------------------


def generate(api: Api, request: Request, ctx: Context) -> Response:
    """POST /api/generate."""
    return api.generate(OllamaGenerateBody, request, ctx)


def chat(api: Api, request: Request, ctx: Context) -> Response:
    """POST /api/chat."""
    return api.generate(OllamaChatBody, request, ctx)


def tags(api: Api, request: Request, ctx: Context) -> Response:
    """GET /api/tags: the served models, as Ollama lists local models."""
    models = [_model_entry(s, name) for s in api.models(request) for name in s.names]
    listing: OllamaTags = {"models": models}
    return json_response(200, listing)


def show(api: Api, request: Request, ctx: Context) -> Response:
    """POST /api/show: a served model's details and template.

    Raises:
        ModelNotFoundError: No served model has that name.
    """
    body = parse(OllamaShowBody, request.body)
    name = body.model or body.name or ""
    served = api.models(request)
    chosen = next((s for s in served if s.named(name) is not None), None)
    if chosen is None:
        have = "', '".join(s.model for s in served)
        raise ModelNotFoundError(f"model '{name}' not found; this server has '{have}'")
    return json_response(200, _show(body, chosen))


def ps(api: Api, request: Request, ctx: Context) -> Response:
    """GET /api/ps: the loaded models (none while one loads: no wait for it), each with
    when it unloads (several models: keep_alive; else for good)."""
    running: list[tuple[Served, str, float | None]] = []
    registry = api.registry
    for state in registry.states:
        if state.service is not None:
            provider = state.service.engine.probe.provider
            running.append((api.served(state.service, state), provider, registry.expires_at(state)))
        elif state.embedder is not None:
            served = api.served_embedding(registry.names(state), state.embedder)
            running.append((served, "cpu", registry.expires_at(state)))
    return json_response(200, _ps(running))


def version(api: Api, request: Request, ctx: Context) -> Response:
    """GET /api/version: ortserve's version, as Ollama says its own."""
    answer: OllamaVersion = {"version": ortserve_version()}
    return json_response(200, answer)


def _show(body: OllamaShowBody, served: Served) -> OllamaShow:
    """/api/show's answer: the served model's details and template.

    Raises:
        ModelNotFoundError: Another model was named.
    """
    name = body.model or body.name or ""
    if served.named(name) is None:
        raise model_not_found(name, served)
    if served.kind == "embedding":
        return _show_embedding(served)
    capabilities = ["completion"]
    if served.chat_template is not None:  # every template family takes tools (tools.py)
        capabilities.append("tools")
    if served.chat_template is not None and "enable_thinking" in served.chat_template:
        capabilities.append("thinking")
    # Ollama's `parameters` text (a name and a value a line): the context, the new tokens
    # a request without num_predict gets, and the sampling defaults; model_info has the limit.
    sampling = served.sampling
    parameters: list[tuple[str, object]] = [
        ("num_predict", served.default_new_tokens),
        ("temperature", sampling.temperature),
        ("top_p", sampling.top_p),
        ("top_k", sampling.top_k),
        ("repeat_penalty", sampling.repetition_penalty),
    ]
    model_info: dict[str, Any] = {"general.architecture": "onnx"}
    if served.context_length:
        parameters.insert(0, ("num_ctx", served.context_length))
        model_info["onnx.context_length"] = served.context_length
    return {
        "modelfile": "",
        "parameters": "\n".join(f"{name:<30} {value}" for name, value in parameters),
        "template": served.chat_template or "",
        "details": _details(served),
        "model_info": {
            **model_info,
            "ortserve.max_new_tokens": served.max_new_tokens,
            "ortserve.precision": served.precision,
            "ortserve.manifest_digest": served.digest,
        },
        "capabilities": capabilities,
        "modified_at": served.created_at,
    }


def _show_embedding(served: Served) -> OllamaShow:
    """/api/show's answer for an embedding model (its capability: `embedding`)."""
    return {
        "modelfile": "",
        "parameters": f"{'num_ctx':<30} {served.context_length}",
        "template": "",
        "details": _details(served),
        "model_info": {
            "general.architecture": "onnx",
            "onnx.context_length": served.context_length,
            "onnx.embedding_length": served.dimensions,
            "ortserve.precision": served.precision,
            "ortserve.manifest_digest": served.digest,
        },
        "capabilities": ["embedding"],
        "modified_at": served.created_at,
    }


def _ps(running: list[tuple[Served, str, float | None]]) -> OllamaPs:
    """/api/ps's answer: the loaded models (none while one loads), each with the execution
    provider it runs on (`size_vram` is its size on a GPU) and when it unloads, in
    `time.time()` seconds (None: for good, said as Ollama says `keep_alive: -1`)."""
    return {"models": [_running(served, provider, at) for served, provider, at in running]}


def _running(served: Served, provider: str, at: float | None) -> OllamaRunning:
    context_length = served.context_length
    entry: OllamaRunning = {
        "name": served.model,
        "model": served.model,
        "size": served.size,
        "digest": served.digest,
        "details": _details(served),
        "expires_at": _timestamp(
            datetime.now(UTC) + _FOREVER if at is None else datetime.fromtimestamp(at, UTC)
        ),
        "size_vram": served.size if provider in _GPU_PROVIDERS else 0,
    }
    if context_length:
        entry["context_length"] = context_length
    return entry


def _model_entry(served: Served, name: str) -> OllamaModel:
    return {
        "name": name,
        "model": name,
        "modified_at": served.created_at,
        "size": served.size,
        "digest": served.digest,
        "details": _details(served, name),
    }


def _details(served: Served, name: str = "") -> OllamaDetails:
    return {
        "parent_model": served.model if served.adapter_of(name) is not None else "",
        "format": "onnx",
        "family": "",
        "families": None,
        "parameter_size": "",
        "quantization_level": served.precision,
    }


def _now() -> str:
    return _timestamp(datetime.now(UTC))


def _timestamp(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")

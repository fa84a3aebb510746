"""Ollama's API: POST /api/generate and /api/chat (NDJSON streams, streamed by default),
GET /api/tags, POST /api/show, GET /api/version, as the official clients call them.

What differs from Ollama, on purpose: the one served model answers (another name is a
404, as on the OpenAI routes); `images`, `tools` and `suffix` get a clear 400;
`repeat_penalty` defaults to 1.0 (onnxruntime-genai penalizes the whole sequence, where
Ollama's 1.1 looks at the last 64 tokens); other options (`num_ctx`, `mirostat`, ...)
and `keep_alive` are ignored, as unknown fields are everywhere.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from core.errors import ModelNotFoundError, OrtServeError
from core.generation import (
    Completion,
    GenerationRequest,
    Guidance,
    SamplingOptions,
    TokenLogprob,
)
from core.protocol import (
    MAX_TOKENS_BOUND,
    SEED,
    TEMPERATURE_DOC,
    TOP_K_DOC,
    Body,
    GenerationBody,
    Int,
    Reply,
    Seed,
    Served,
    Stop,
    integral,
    json_guidance,
)

_NS = 1_000_000_000
_NOT_SUPPORTED = "not supported by ortserve"


class OllamaOptions(Body):
    """`options`: the sampling parameters ortserve has (Ollama's defaults)."""

    temperature: float = Field(default=0.8, ge=0.0, le=2.0, description=TEMPERATURE_DOC)
    top_p: float = Field(default=0.9, gt=0.0, le=1.0)
    top_k: Int = Field(default=40, ge=0, le=100000, description=TOP_K_DOC)
    num_predict: Annotated[int, Field(ge=-2, le=MAX_TOKENS_BOUND), BeforeValidator(integral)] = (
        Field(default=-1, description="-1 or -2: as many as fit (the server's limit)")
    )
    repeat_penalty: float = Field(default=1.0, gt=0.0, le=2.0)
    seed: Seed | None = SEED
    stop: Stop = None


def model_not_found(name: str, served: Served) -> ModelNotFoundError:
    """Ollama's 404 for a model this server does not have."""
    return ModelNotFoundError(f"model '{name}' not found; this server has '{served.model}'")


class _OllamaBody(GenerationBody):
    model: str = Field(min_length=1)
    format: Literal["json"] | dict[str, Any] | None = Field(
        default=None, description='"json", or a JSON schema the output must match'
    )
    options: OllamaOptions = Field(default_factory=OllamaOptions)
    stream: bool = True
    think: bool | None = Field(
        default=None, description="the template's thinking switch (enable_thinking)"
    )

    def _options(self, served: Served) -> SamplingOptions:
        if self.model != served.model:
            raise model_not_found(self.model, served)
        o = self.options
        limit = o.num_predict if o.num_predict > 0 else served.max_new_tokens
        return SamplingOptions(
            max_new_tokens=limit, temperature=o.temperature, top_p=o.top_p, top_k=o.top_k,
            repetition_penalty=o.repeat_penalty, seed=o.seed,
        )  # fmt: skip

    def _guidance(self) -> Guidance | None:
        if self.format is None:
            return None
        return json_guidance({"type": "object"} if self.format == "json" else self.format)

    def _template_kwargs(self) -> dict[str, Any] | None:
        return None if self.think is None else {"enable_thinking": self.think}

    def _request(self, served: Served, **text: Any) -> GenerationRequest:
        return GenerationRequest(
            **text, options=self._options(served), stop=tuple(self.options.stop or ()),
            guidance=self._guidance(), limit_field="options.num_predict",
        )  # fmt: skip


class OllamaGenerateBody(_OllamaBody):
    """POST /api/generate: the prompt goes through the model's chat template as a user
    turn (after `system`), unless `raw` is true or the model has no template."""

    prompt: str = Field(min_length=1)
    system: str | None = None
    raw: bool = False
    images: list[str] | None = Field(default=None, max_length=0, description=_NOT_SUPPORTED)
    suffix: Literal[""] | None = Field(default=None, description=_NOT_SUPPORTED)

    def to_generation(self, served: Served) -> GenerationRequest:
        if self.raw or served.chat_template is None:
            return self._request(served, prompt=self.prompt)
        messages = [{"role": "user", "content": self.prompt}]
        if self.system:
            messages.insert(0, {"role": "system", "content": self.system})
        return self._request(served, messages=messages, template_kwargs=self._template_kwargs())

    def reply(self, request_id: str, served: Served) -> Reply:
        return OllamaReply(served.model, "response")


class OllamaMessage(Body):
    """One chat message."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None
    tool_name: str | None = None
    images: list[str] | None = Field(default=None, max_length=0, description=_NOT_SUPPORTED)

    def as_template_input(self) -> dict[str, Any]:
        """The message as chat templates expect it (`thinking` as reasoning_content)."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.thinking is not None:
            message["reasoning_content"] = self.thinking
        if self.tool_name is not None:
            message["name"] = self.tool_name
        return message


class OllamaChatBody(_OllamaBody):
    """POST /api/chat."""

    messages: list[OllamaMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = Field(
        default=None, max_length=0, description=_NOT_SUPPORTED
    )

    def to_generation(self, served: Served) -> GenerationRequest:
        messages = [m.as_template_input() for m in self.messages]
        return self._request(served, messages=messages, template_kwargs=self._template_kwargs())

    def reply(self, request_id: str, served: Served) -> Reply:
        return OllamaReply(served.model, "message")


class OllamaReply(Reply):
    """Ollama's answer: NDJSON lines of `{model, created_at, response | message, done}`,
    the last with `done: true`, `done_reason` and the counts and durations (ns)."""

    framing = "ndjson"
    done_marker = False

    def __init__(self, model: str, text_field: Literal["response", "message"]) -> None:
        self.model = model
        self.text_field = text_field

    def _line(self, text: str, done: bool) -> dict[str, Any]:
        value: Any = text
        if self.text_field == "message":
            value = {"role": "assistant", "content": text}
        return {"model": self.model, "created_at": _now(), self.text_field: value, "done": done}

    @staticmethod
    def _figures(done: Completion) -> dict[str, Any]:
        timings = done.timings
        return {
            "done_reason": _done_reason(done),
            "total_duration": round((timings.ttft_s + timings.decode_s) * _NS),
            "load_duration": 0,
            "prompt_eval_count": done.prompt_tokens,
            "prompt_eval_duration": round(timings.ttft_s * _NS),
            "eval_count": done.completion_tokens,
            "eval_duration": round(timings.decode_s * _NS),
        }

    def delta(self, text: str, logprobs: list[TokenLogprob] | None = None) -> dict[str, Any]:
        return self._line(text, False)

    def final_events(self, done: Completion) -> list[dict[str, Any]]:
        return [{**self._line("", True), **self._figures(done)}]

    def body(self, done: Completion) -> dict[str, Any]:
        return {**self._line(done.text, True), **self._figures(done)}

    def error_event(self, exc: OrtServeError) -> dict[str, Any]:
        return {"error": exc.message}


class OllamaShowBody(Body):
    """POST /api/show (`name` is the old spelling of `model`)."""

    model: str | None = Field(default=None, min_length=1)
    name: str | None = Field(default=None, min_length=1)


def tags(served: Served) -> dict[str, Any]:
    """GET /api/tags: the served model, as Ollama lists local models."""
    return {"models": [{"name": served.model, **_model_entry(served)}]}


def show(body: OllamaShowBody, served: Served) -> dict[str, Any]:
    """POST /api/show: the served model's details and template.

    Raises:
        ModelNotFoundError: Another model was named.
    """
    name = body.model or body.name or ""
    if name != served.model:
        raise model_not_found(name, served)
    capabilities = ["completion"]
    if served.chat_template is not None and "enable_thinking" in served.chat_template:
        capabilities.append("thinking")
    return {
        "modelfile": "",
        "parameters": "",
        "template": served.chat_template or "",
        "details": _details(served),
        "model_info": {
            "general.architecture": "onnx",
            "ortserve.precision": served.precision,
            "ortserve.manifest_digest": served.digest,
        },
        "capabilities": capabilities,
        "modified_at": served.created_at,
    }


def _model_entry(served: Served) -> dict[str, Any]:
    return {"model": served.model, "modified_at": served.created_at, "size": served.size,
            "digest": served.digest, "details": _details(served)}  # fmt: skip


def _details(served: Served) -> dict[str, Any]:
    return {"parent_model": "", "format": "onnx", "family": "", "families": None,
            "parameter_size": "", "quantization_level": served.precision}  # fmt: skip


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _done_reason(done: Completion) -> str:
    """Ollama's `done_reason`: `stop`, `length`, or the content filter's end (which
    Ollama itself does not have; OpenAI's name for it)."""
    if done.finish_reason in ("stop", "content_filter"):
        return done.finish_reason
    return "length"

"""The OpenAI-compatible API: POST /v1/completions and /v1/chat/completions, their
bodies and their answers (objects and stream chunks as OpenAI's API returns them), and
GET /v1/models and /v1/models/{model}."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field

from ortserve.core.errors import InvalidRequestError, ModelNotFoundError
from ortserve.core.generation import (
    Completion,
    GenerationRequest,
    Guidance,
    SamplingOptions,
    TokenLogprob,
)
from ortserve.core.http import Request, Response, json_response
from ortserve.core.protocol import (
    IGNORE_EOS_DOC,
    MIN_TOKENS_DOC,
    NO_MINIMUM,
    NO_MINIMUM_PROPERTIES,
    REPETITION_PENALTY_DOC,
    SEED,
    SPECULATIVE_DOC,
    TEMPERATURE_DOC,
    TOOL_CHOICE_NEEDS_TOOLS,
    TOP_K_DOC,
    TOP_P_DOC,
    UNAPPLIED,
    Body,
    Event,
    GenerationBody,
    Int,
    JsonSchema,
    MultiChoiceReply,
    NoBias,
    NoPenalty,
    Reply,
    Seed,
    Served,
    Stop,
    TextPart,
    TokenCount,
    TokenLimit,
    TopK,
    integral,
    json_guidance,
    public_finish,
    when_a_call_is_forced,
)
from ortserve.core.protocol.replies import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    ChatTokenLogprob,
    ChunkToolCall,
    CompletionChoice,
    CompletionLogprobs,
    ModelCard,
    ModelList,
    OpenAIFinish,
    TextCompletion,
    TopLogprob,
    Usage,
)
from ortserve.core.protocol.tools import MAX_TOOLS, Tool, ToolPlan, plan_tools, with_tools

if TYPE_CHECKING:  # core.api imports core.routes, which imports this module
    from ortserve.core.api import Api, Context

MAX_CHOICES = 8  # n's bound: choices decode side by side, a batch of MAX_BATCH at a time


class StreamOptions(Body):
    """OpenAI stream_options."""

    include_usage: bool = False


#: Fields of OpenAI's requests that ask nothing of the generation (bookkeeping, billing,
#: OpenAI's own storage and caches): accepted, not used. The penalties ortserve does not
#: apply are fields taken at 0 only (`NoPenalty`): never ignored when they ask for more.
OPENAI_ACCEPTED = frozenset(
    {
        "user",
        "store",
        "metadata",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
    }
)


def check_model(served: Served, model: str | None) -> None:
    """Refuse a model other than the served one.

    Raises:
        ModelNotFoundError: `model` names another model.
    """
    if served.named(model) is None:
        raise ModelNotFoundError(
            f"the model {model!r} does not exist; this server has {served.model!r}"
        )


class _OpenAIBody(GenerationBody):
    accepted = OPENAI_ACCEPTED

    model: str | None = None
    max_tokens: TokenLimit | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, description=TEMPERATURE_DOC)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, description=TOP_P_DOC)
    top_k: TopK | None = Field(
        default=None, description=f"extension (vLLM's, llama-server's): {TOP_K_DOC}"
    )
    repetition_penalty: float | None = Field(
        default=None,
        gt=0.0,
        le=2.0,
        description=f"extension (vLLM's): {REPETITION_PENALTY_DOC}",
    )
    frequency_penalty: NoPenalty | None = Field(default=None, description=f"0 only: {UNAPPLIED}")
    presence_penalty: NoPenalty | None = Field(default=None, description=f"0 only: {UNAPPLIED}")
    logit_bias: NoBias | None = Field(default=None, description=f"empty only: {UNAPPLIED}")
    seed: Seed | None = SEED
    stop: Stop = None
    n: Int = Field(
        default=1,
        ge=1,
        le=MAX_CHOICES,
        description="choices to generate (decoded side by side; with a seed, choice i "
        "uses seed + i)",
    )
    stream_options: StreamOptions | None = None
    min_tokens: TokenCount = Field(default=0, description=MIN_TOKENS_DOC)
    ignore_eos: bool = Field(default=False, description=IGNORE_EOS_DOC)
    speculative: bool = Field(default=True, description=SPECULATIVE_DOC)

    def _limit(self) -> tuple[int | None, str]:
        """The token limit the body gives, and the field that gives it."""
        return self.max_tokens, "max_tokens"

    def _options(self, served: Served, default_limit: int) -> tuple[SamplingOptions, str]:
        """Sampling options (OpenAI's default limit when none is given) and the limit's
        field name; refuses a model other than the served one."""
        check_model(served, self.model)
        max_tokens, field = self._limit()
        if max_tokens is None:
            limit = max(default_limit, min(self.min_tokens, served.max_new_tokens))
        else:
            limit = max_tokens
        # The server checks it against its limit (Service.budget); ignore_eos: all of it.
        minimum = limit if self.ignore_eos else self.min_tokens
        options = SamplingOptions(
            max_new_tokens=limit,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            repetition_penalty=self.repetition_penalty,
            seed=self.seed,
            min_new_tokens=minimum,
            speculative=self.speculative,
            adapter=served.adapter_of(self.model),
        )
        return options, field

    @property
    def choices(self) -> int:
        return self.n

    @property
    def _include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


def _usage(dones: Sequence[Completion]) -> Usage:
    """Usage of one request: its prompt once, every choice's new tokens."""
    prompt = dones[0].prompt_tokens
    completion = sum(d.completion_tokens for d in dones)
    cached = max(d.cached_tokens for d in dones)
    drafts = [d.drafts for d in dones if d.drafts is not None]
    accepted = sum(d.accepted for d in drafts)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": sum(d.drafted for d in drafts) - accepted,
        },
    }


@dataclass(frozen=True)
class _Header:
    """What every object of one answer carries: its id, time, model (and, chat only, the
    system fingerprint)."""

    id: str
    created: int
    model: str


class _OpenAIReply(MultiChoiceReply):
    """Shared by both routes: every object carries `header`; with `include_usage`
    (`stream_options.include_usage`), a usage chunk ends a stream; `token_bytes` turns
    token ids into their bytes when log probabilities were asked for."""

    def __init__(
        self,
        header: _Header,
        include_usage: bool,
        token_bytes: Callable[[int], bytes] | None = None,
    ) -> None:
        self.header = header
        self.include_usage = include_usage
        self.token_bytes = token_bytes

    def _token(self, token_id: int) -> tuple[str, list[int]]:
        """A token's text (invalid UTF-8, as a piece of a character: U+FFFD) and bytes."""
        assert self.token_bytes is not None  # only with logprobs
        raw = self.token_bytes(token_id)
        return raw.decode("utf-8", errors="replace"), list(raw)

    def body(self, done: Completion) -> Event:
        return self.bodies([done])

    def final_events(self, done: Completion) -> list[Event]:
        return [*self.finish_events(done), *self.usage_events([done])]


# -- /v1/completions ---------------------------------------------------------------------


_Prompt = Annotated[str, Field(min_length=1)]


def _a_boolean(value: Any) -> Any:
    if not isinstance(value, bool):
        raise ValueError("Input should be a valid boolean")
    return value


class CompletionBody(_OpenAIBody):
    """POST /v1/completions."""

    prompt: _Prompt | Annotated[list[_Prompt], Field(min_length=1, max_length=1)] = Field(
        description="one prompt (a list holds exactly one)"
    )
    logprobs: Annotated[int, Field(ge=0, le=5), BeforeValidator(integral)] | None = Field(
        default=None,
        description="each token's log probability and this many most likely alternatives "
        "(of the model's distribution, before temperature, top_p and penalties)",
    )
    # Literal[False] alone takes 0 and 0.0 (equal to False in Python): a boolean first.
    echo: Annotated[Literal[False], BeforeValidator(_a_boolean)] = Field(
        default=False, description="not supported"
    )

    def text(self) -> str:
        """The single prompt."""
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def to_generation(self, served: Served) -> GenerationRequest:
        # OpenAI's default for completions: 16 tokens.
        options, field = self._options(served, min(16, served.max_new_tokens))
        return GenerationRequest(
            prompt=self.text(),
            options=options,
            stop=tuple(self.stop or ()),
            limit_field=field,
            logprobs=self.logprobs,
        )

    def reply(self, request_id: str, served: Served) -> Reply:
        header = _Header(f"cmpl-{request_id}", int(time.time()), served.answering(self.model))
        wants = self.logprobs is not None
        return CompletionReply(header, self._include_usage, served.token_bytes if wants else None)


class CompletionReply(_OpenAIReply):
    """A `text_completion` object, or its chunks; log probabilities in the legacy shape
    (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`)."""

    def __init__(
        self,
        header: _Header,
        include_usage: bool,
        token_bytes: Callable[[int], bytes] | None = None,
    ) -> None:
        super().__init__(header, include_usage, token_bytes)
        self._offsets: dict[int, int] = {}  # per choice: characters its tokens so far span

    def _object(self, choices: list[CompletionChoice]) -> TextCompletion:
        header = self.header
        return {
            "id": header.id,
            "object": "text_completion",
            "created": header.created,
            "model": header.model,
            "choices": choices,
        }

    def _logprobs(
        self, entries: Sequence[TokenLogprob] | None, index: int
    ) -> CompletionLogprobs | None:
        if entries is None or self.token_bytes is None:
            return None
        tokens, offsets, tops = [], [], []
        for entry in entries:
            text, _ = self._token(entry.token_id)
            tokens.append(text)
            offsets.append(self._offsets.get(index, 0))
            self._offsets[index] = offsets[-1] + len(text)
            tops.append({self._token(i)[0]: lp for i, lp in entry.top} if entry.top else None)
        return {
            "tokens": tokens,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def delta(
        self, text: str, logprobs: list[TokenLogprob] | None = None, index: int = 0
    ) -> TextCompletion:
        logprobs_out = self._logprobs(logprobs, index)
        choice: CompletionChoice = {
            "index": index,
            "text": text,
            "logprobs": logprobs_out,
            "finish_reason": None,
        }
        return self._object([choice])

    def finish_events(self, done: Completion, index: int = 0) -> list[TextCompletion]:
        finish = public_finish(done)
        choice: CompletionChoice = {
            "index": index,
            "text": "",
            "logprobs": None,
            "finish_reason": finish,
        }
        return [self._object([choice])]

    def usage_events(self, dones: Sequence[Completion]) -> list[TextCompletion]:
        if not self.include_usage:
            return []
        chunk = self._object([])
        chunk["usage"] = _usage(dones)
        return [chunk]

    def bodies(self, dones: Sequence[Completion]) -> TextCompletion:
        choices: list[CompletionChoice] = []
        for index, done in enumerate(dones):
            self._offsets.pop(index, None)
            logprobs = self._logprobs(done.logprobs, index)
            finish = public_finish(done)
            choices.append(
                {"index": index, "text": done.text, "logprobs": logprobs, "finish_reason": finish}
            )
        whole = self._object(choices)
        whole["usage"] = _usage(dones)
        return whole


# -- /v1/chat/completions ----------------------------------------------------------------


class ContentPart(TextPart):
    """One part of a message's content; only text parts are supported (an image part is
    refused in words)."""

    type: Literal["text"]
    text: str


class FunctionCallIn(Body):
    """A call an assistant turn made: `arguments` is a JSON object as a string."""

    name: str
    arguments: str


class ToolCallIn(Body):
    """One of an assistant turn's `tool_calls`."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(Body):
    """One chat message (an assistant reply sent back as it came, `refusal` and
    `annotations` included, is accepted)."""

    accepted = frozenset({"refusal", "annotations"})

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    reasoning_content: str | None = Field(
        default=None,
        description="an assistant turn's reasoning (templates such as Qwen3's "
        "drop it from earlier turns)",
    )
    tool_call_id: str | None = None
    tool_calls: list[ToolCallIn] | None = Field(
        default=None, description="an assistant turn's calls (sent back with the results)"
    )

    def as_template_input(self) -> dict[str, Any]:
        """The message as chat templates expect it: role, plain-text content (text parts
        joined), and the optional keys that were given."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": content or ""}
        for key in ("name", "reasoning_content", "tool_call_id"):
            value = getattr(self, key)
            if value is not None:
                message[key] = value
        if self.tool_calls:
            message["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        return message


class NamedFunction(Body):
    """The function a named `tool_choice` calls."""

    name: str


class NamedToolChoice(Body):
    """`tool_choice` naming one function: the model must call it."""

    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(Body):
    """response_format.json_schema (its `description` is accepted, not used)."""

    accepted = frozenset({"description"})

    name: str = Field(min_length=1, max_length=64)
    schema_: JsonSchema = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class TextFormat(Body):
    """response_format `text`: no constraint."""

    type: Literal["text"]

    def guidance(self) -> Guidance | None:
        """No constrained decoding."""
        return None


class JsonObjectFormat(Body):
    """response_format `json_object`: any JSON object."""

    type: Literal["json_object"]

    def guidance(self) -> Guidance | None:
        """A JSON object (compact, `json_guidance`)."""
        return json_guidance({"type": "object"}, "response_format")


class JsonSchemaResponseFormat(Body):
    """response_format `json_schema`: JSON valid against the given schema."""

    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat

    def guidance(self) -> Guidance | None:
        """JSON valid against the schema (compact, `json_guidance`), its objects closed at
        their declared properties unless `strict` is false."""
        return json_guidance(
            dict(self.json_schema.schema_),
            "response_format.json_schema.schema",
            self.json_schema.strict is not False,
        )


#: response_format: text, json_object or json_schema (which needs its `json_schema`).
ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaResponseFormat, Field(discriminator="type")
]


class ChatBody(_OpenAIBody):
    """POST /v1/chat/completions."""

    # The schema says the rules between fields: top_logprobs needs logprobs: true,
    # tool_choice needs tools, and a required or named call takes no response_format.
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": {
                        "properties": {"top_logprobs": {"type": "integer"}},
                        "required": ["top_logprobs"],
                    },
                    "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]},
                },
                TOOL_CHOICE_NEEDS_TOOLS,
                # A required or named call is constrained already: no response_format beside it.
                when_a_call_is_forced(
                    {"properties": {"response_format": {"type": "null"}, **NO_MINIMUM_PROPERTIES}}
                ),
                # Constrained output takes no minimum length.
                {
                    "if": {
                        "properties": {
                            "response_format": {
                                "type": "object",
                                "properties": {"type": {"enum": ["json_object", "json_schema"]}},
                                "required": ["type"],
                            }
                        },
                        "required": ["response_format"],
                    },
                    "then": NO_MINIMUM,
                },
            ]
        }
    )

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: TokenLimit | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool = Field(
        default=False,
        description="each token's log probability (of the model's distribution, before "
        "temperature, top_p and penalties)",
    )
    top_logprobs: Annotated[int, Field(ge=0, le=20), BeforeValidator(integral)] | None = Field(
        default=None, description="this many most likely alternatives per token (needs logprobs)"
    )
    tools: list[Tool] | None = Field(
        default=None,
        max_length=MAX_TOOLS,
        description="functions the model may call (the chat template's family decides how "
        "they are prompted and read)",
    )
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        default=None,
        description="auto (the default with tools), none, required or a named function: "
        "the last two constrain the output to a valid call",
    )
    parallel_tool_calls: bool = Field(
        default=True, description="accepted; a constrained call is one call per turn"
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None,
        description="extra variables for the model's chat template, e.g. "
        '{"enable_thinking": false} for Qwen3 (as vLLM and llama-server accept)',
    )

    def _limit(self) -> tuple[int | None, str]:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def tool_plan(self, served: Served) -> ToolPlan | None:
        """How this request's tools are prompted, constrained and read (None: no tools,
        or tool_choice none).

        Raises:
            InvalidRequestError: tool_choice without tools, a named function that is not
                one of them, or a constrained call beside a response_format.
        """
        choice = self.tool_choice
        if choice is not None and not self.tools:
            raise InvalidRequestError("tool_choice needs tools", "tool_choice")
        if not self.tools or choice == "none":
            return None
        name = choice.function.name if isinstance(choice, NamedToolChoice) else None
        if name is not None and name not in [t.function.name for t in self.tools]:
            raise InvalidRequestError(
                f"tool_choice names {name!r}, which is not one of the tools", "tool_choice"
            )
        chosen = name if name is not None else (choice if isinstance(choice, str) else "auto")
        tools = plan_tools(self.tools, chosen, served)
        if tools.guidance() is not None and self.response_format is not None:
            where = "response_format"
            raise InvalidRequestError(
                f"{where} cannot be combined with a required tool call", where
            )
        return tools

    def to_generation(self, served: Served) -> GenerationRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs: true", "top_logprobs")
        # OpenAI's default for chat: as many as fit (capped by the context).
        options, field = self._options(served, served.default_new_tokens)
        messages = [m.as_template_input() for m in self.messages]
        guidance = self.response_format.guidance() if self.response_format else None
        messages, guidance, tools = with_tools(self.tool_plan(served), messages, guidance)
        return GenerationRequest(
            messages=messages,
            template_kwargs=self.chat_template_kwargs,
            options=options,
            stop=tuple(self.stop or ()),
            guidance=guidance,
            limit_field=field,
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
            tools=tools,
        )

    def reply(self, request_id: str, served: Served) -> Reply:
        return ChatReply(
            _Header(f"chatcmpl-{request_id}", int(time.time()), served.answering(self.model)),
            f"fp_{served.digest[:12]}",
            self._include_usage,
            served.token_bytes if self.logprobs else None,
            self.tool_plan(served),
        )


class ChatReply(_OpenAIReply):
    """A `chat.completion` object, or its `chat.completion.chunk`s. With tools, the text
    is read for calls once it is whole: a stream holds its text back and ends with the
    calls as `delta.tool_calls` chunks (as OpenAI streams them) or with the text."""

    def __init__(
        self,
        header: _Header,
        fingerprint: str,
        include_usage: bool,
        token_bytes: Callable[[int], bytes] | None = None,
        tools: ToolPlan | None = None,
    ) -> None:
        super().__init__(header, include_usage, token_bytes)
        self.fingerprint = fingerprint
        self.tools = tools

    def _chunk(self, choices: list[ChatChunkChoice]) -> ChatCompletionChunk:
        header = self.header
        return {
            "id": header.id,
            "object": "chat.completion.chunk",
            "created": header.created,
            "model": header.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
        }

    def _choice(
        self,
        index: int,
        delta: ChatDelta,
        logprobs: ChatLogprobs | None = None,
        finish: OpenAIFinish | None = None,
    ) -> ChatCompletionChunk:
        return self._chunk(
            [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
        )

    def delta(
        self, text: str, logprobs: list[TokenLogprob] | None = None, index: int = 0
    ) -> ChatCompletionChunk | None:
        if self.tools is not None:
            return None  # held back until the whole text says whether it is a call
        return self._choice(index, {"content": text}, self._logprobs(logprobs))

    def finish_events(self, done: Completion, index: int = 0) -> list[ChatCompletionChunk]:
        finish = self._choice(index, {}, None, public_finish(done))
        if self.tools is None:
            return [finish]
        calls = self.tools.parse(done.text)
        if not calls:
            return [self._choice(index, {"content": done.text}), finish]
        events = []
        for k, call in enumerate(calls):
            opening: ChunkToolCall = {
                "index": k,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            arguments: ChunkToolCall = {"index": k, "function": {"arguments": call.arguments}}
            for part in (opening, arguments):
                events.append(self._choice(index, {"tool_calls": [part]}))
        return [*events, self._choice(index, {}, None, "tool_calls")]

    def first_events(self, index: int = 0) -> list[ChatCompletionChunk]:
        return [self._choice(index, {"role": "assistant", "content": ""})]

    def usage_events(self, dones: Sequence[Completion]) -> list[ChatCompletionChunk]:
        if not self.include_usage:
            return []
        chunk = self._chunk([])
        chunk["usage"] = _usage(dones)
        return [chunk]

    def _logprobs(self, entries: Sequence[TokenLogprob] | None) -> ChatLogprobs | None:
        if entries is None or self.token_bytes is None:
            return None

        def top(token_id: int, logprob: float) -> TopLogprob:
            text, raw = self._token(token_id)
            return {"token": text, "logprob": logprob, "bytes": raw}

        def entry(e: TokenLogprob) -> ChatTokenLogprob:
            text, raw = self._token(e.token_id)
            tops = [top(i, lp) for i, lp in e.top]
            return {"token": text, "logprob": e.logprob, "bytes": raw, "top_logprobs": tops}

        return {"content": [entry(e) for e in entries], "refusal": None}

    def bodies(self, dones: Sequence[Completion]) -> ChatCompletion:
        header = self.header
        return {
            "id": header.id,
            "object": "chat.completion",
            "created": header.created,
            "model": header.model,
            "system_fingerprint": self.fingerprint,
            "choices": [self._whole(done, i) for i, done in enumerate(dones)],
            "usage": _usage(dones),
        }

    def _whole(self, done: Completion, index: int) -> ChatChoice:
        calls = self.tools.parse(done.text) if self.tools is not None else []
        message: AssistantMessage = {"role": "assistant", "content": done.text, "refusal": None}
        finish: OpenAIFinish = public_finish(done)
        if calls:
            message["content"] = None
            message["tool_calls"] = [c.as_openai() for c in calls]
            finish = "tool_calls"
        return {
            "index": index,
            "message": message,
            "logprobs": self._logprobs(done.logprobs),
            "finish_reason": finish,
        }


# -- the routes' answers (core.routes) ---------------------------------------------------

_MODEL_PREFIX = "/v1/models/"


def completions(api: Api, request: Request, ctx: Context) -> Response:
    """POST /v1/completions."""
    return api.generate(CompletionBody, request, ctx)


def chat_completions(api: Api, request: Request, ctx: Context) -> Response:
    """POST /v1/chat/completions."""
    return api.generate(ChatBody, request, ctx)


def models(api: Api, request: Request, ctx: Context) -> Response:
    """GET /v1/models: the served model, once under each name it is served as."""
    served = api.served(api.loaded(request))
    cards = [_model_card(served, name) for name in served.names]
    listing: ModelList = {"object": "list", "data": cards}
    return json_response(200, listing)


def model(api: Api, request: Request, ctx: Context) -> Response:
    """GET /v1/models/{model}: the served model, under the name asked for (an id may hold
    slashes).

    Raises:
        ModelNotFoundError: Another model was named.
    """
    served = api.served(api.loaded(request))
    name = request.path.removeprefix(_MODEL_PREFIX)
    listed = served.named(name) if name else None
    if listed is None:
        raise ModelNotFoundError(
            f"the model {name!r} does not exist; this server has {served.model!r}"
        )
    return json_response(200, _model_card(served, listed))


def _model_card(served: Served, name: str) -> ModelCard:
    """An OpenAI model object for the served model's `name`, with vLLM's `max_model_len`
    (the context; omitted where unknown), `max_tokens`: the most new tokens a request
    may ask for, and the sampling defaults."""
    card: ModelCard = {
        "id": name,
        "object": "model",
        "created": served.created,
        "owned_by": "ortserve",
        "max_tokens": served.max_new_tokens,
        "sampling": served.sampling_card(),
    }
    if served.context_length:
        card["max_model_len"] = served.context_length
    if served.adapter_of(name) is not None:  # vLLM's: a LoRA adapter's base model
        card["parent"] = served.model
    return card

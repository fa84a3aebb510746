"""The shapes of every JSON reply: whole answers, stream chunks and events, and the GET
routes' bodies, as TypedDicts. The protocol modules build them (mypy checks each key
and type), and the OpenAPI document publishes them (core.openapi: `REPLIES`), so
clients and the schemathesis test can check a reply against the schema.

Only the standard library and typing_extensions: the Lambda and GCF cold paths import
the protocol modules.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, Required

# pydantic (which writes their JSON schemas) needs typing_extensions' TypedDict before
# Python 3.12; typing_extensions comes with pydantic.
from typing_extensions import TypedDict

from ortserve.core.description import ModelDescription

#: How an OpenAI answer ended (`tool_calls`: chat, when it stopped on calls).
OpenAIFinish = Literal["stop", "length", "content_filter", "tool_calls"]

# -- OpenAI: shared ------------------------------------------------------------------------


class PromptTokensDetails(TypedDict):
    cached_tokens: int


class Usage(TypedDict):
    """A request's token counts: its prompt once, every choice's new tokens."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class FunctionCall(TypedDict):
    name: str
    arguments: str


class ToolCall(TypedDict):
    """One call the model made (OpenAI's `tool_calls` entry)."""

    id: str
    type: Literal["function"]
    function: FunctionCall


# -- /v1/completions -------------------------------------------------------------------------


class CompletionLogprobs(TypedDict):
    """The legacy log-probability shape of /v1/completions."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(TypedDict):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: OpenAIFinish | None


class TextCompletion(TypedDict):
    """POST /v1/completions: the whole answer, and (object `text_completion` too) each
    chunk of a stream; a stream's usage chunk has no choices and a `usage`."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: NotRequired[Usage]


# -- /v1/chat/completions --------------------------------------------------------------------


class TopLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(TypedDict):
    content: list[ChatTokenLogprob]
    refusal: None


class AssistantMessage(TypedDict):
    role: Literal["assistant"]
    content: str | None
    refusal: None
    tool_calls: NotRequired[list[ToolCall]]


class ChatChoice(TypedDict):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: OpenAIFinish


class ChatCompletion(TypedDict):
    """POST /v1/chat/completions: the whole answer."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChoice]
    usage: Usage


class ChunkFunction(TypedDict, total=False):
    name: str
    arguments: str


class ChunkToolCall(TypedDict):
    """A piece of a call in a stream: the first piece has its id, type and name, the
    next its arguments."""

    index: int
    id: NotRequired[str]
    type: NotRequired[Literal["function"]]
    function: ChunkFunction


class ChatDelta(TypedDict, total=False):
    role: Literal["assistant"]
    content: str
    tool_calls: list[ChunkToolCall]


class ChatChunkChoice(TypedDict):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: OpenAIFinish | None


class ChatCompletionChunk(TypedDict):
    """One `data:` event of a streamed chat completion; the usage chunk (with
    `stream_options.include_usage`) has no choices and a `usage`."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChunkChoice]
    usage: NotRequired[Usage]


class SamplingCard(TypedDict):
    """The sampling a request that leaves these fields out gets, and where it comes from
    (the model's generation_config.json, or ortserve's default)."""

    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    origin: str


class ModelCard(TypedDict):
    """An OpenAI model object, with vLLM's `max_model_len` (the context; left out where
    unknown), `max_tokens`: the most new tokens a request may ask for, and `sampling`:
    the model's sampling defaults."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: NotRequired[int]
    max_tokens: int
    sampling: SamplingCard


class ModelList(TypedDict):
    """GET /v1/models."""

    object: Literal["list"]
    data: list[ModelCard]


# -- /generate (native) ----------------------------------------------------------------------

#: How a native answer ended (`cancelled`: its client left, or it was stopped).
NativeFinish = Literal["stop", "length", "cancelled", "content_filter"]


class Generated(TypedDict):
    """POST /generate: the whole answer."""

    generated_text: str
    tokens_generated: int
    prompt_tokens: int
    finish_reason: NativeFinish


class GeneratedText(TypedDict):
    """A streamed /generate event of text."""

    text: str


class GeneratedEnd(TypedDict):
    """The last event of a streamed /generate."""

    done: Literal[True]
    tokens_generated: int
    prompt_tokens: int
    finish_reason: NativeFinish


# -- Ollama ----------------------------------------------------------------------------------


class OllamaFunction(TypedDict):
    name: str
    arguments: dict[str, Any]


class OllamaReplyToolCall(TypedDict):
    function: OllamaFunction


class OllamaAssistantMessage(TypedDict):
    role: Literal["assistant"]
    content: str
    tool_calls: NotRequired[list[OllamaReplyToolCall]]


class OllamaLine(TypedDict):
    """POST /api/generate (`response`) and /api/chat (`message`): each NDJSON line, and
    the whole answer; the last line (and the whole answer) says `done: true` with the
    reason, the counts and the durations (ns)."""

    model: str
    created_at: str
    response: NotRequired[str]
    message: NotRequired[OllamaAssistantMessage]
    done: bool
    done_reason: NotRequired[Literal["stop", "length", "content_filter", "load", "unload"]]
    total_duration: NotRequired[int]
    load_duration: NotRequired[int]
    prompt_eval_count: NotRequired[int]
    prompt_eval_duration: NotRequired[int]
    eval_count: NotRequired[int]
    eval_duration: NotRequired[int]


class OllamaDetails(TypedDict):
    parent_model: str
    format: str
    family: str
    families: None
    parameter_size: str
    quantization_level: str


class OllamaModel(TypedDict):
    """One entry of GET /api/tags."""

    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: OllamaDetails


class OllamaTags(TypedDict):
    """GET /api/tags."""

    models: list[OllamaModel]


class OllamaShow(TypedDict):
    """POST /api/show."""

    modelfile: str
    parameters: str
    template: str
    details: OllamaDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class OllamaRunning(TypedDict):
    """One entry of GET /api/ps."""

    name: str
    model: str
    size: int
    digest: str
    details: OllamaDetails
    expires_at: str
    size_vram: int
    context_length: NotRequired[int]


class OllamaPs(TypedDict):
    """GET /api/ps."""

    models: list[OllamaRunning]


class OllamaVersion(TypedDict):
    """GET /api/version."""

    version: str


# -- health ----------------------------------------------------------------------------------


class Health(ModelDescription, total=False):
    """GET /healthz (with `alive: true`) and /readyz (200 when `status` is `ready`, else
    503): the model's state and description, and the requests being answered."""

    status: Required[Literal["loading", "ready", "restarting", "failed", "draining"]]
    active: int
    waiting: int
    alive: bool


#: Every reply shape, by the name the OpenAPI document gives it.
REPLIES: tuple[type, ...] = (
    TextCompletion,
    ChatCompletion,
    ChatCompletionChunk,
    ModelCard,
    ModelList,
    Generated,
    GeneratedText,
    GeneratedEnd,
    OllamaLine,
    OllamaTags,
    OllamaShow,
    OllamaPs,
    OllamaVersion,
    Health,
)

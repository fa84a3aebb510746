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


class CompletionTokensDetails(TypedDict):
    """Speculative decoding's drafts, in OpenAI's predicted-output fields: draft tokens
    the model accepted, and those it rejected (0 and 0 without speculation)."""

    accepted_prediction_tokens: int
    rejected_prediction_tokens: int


class Usage(TypedDict):
    """A request's token counts: its prompt once, every choice's new tokens."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails


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
    unknown), `max_tokens`: the most new tokens a request may ask for, `sampling`: the
    model's sampling defaults, and vLLM's `parent`: a LoRA adapter's base model (only on
    `MODEL:ADAPTER` ids)."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: NotRequired[int]
    max_tokens: NotRequired[int]
    sampling: NotRequired[SamplingCard]
    parent: NotRequired[str]


class LoraAdapterReply(TypedDict):
    """POST /v1/load_lora_adapter, /v1/unload_lora_adapter: the adapter (`id`: how
    requests name it), whether it is loaded now, whether this request changed that, and
    every adapter loaded."""

    object: Literal["lora_adapter"]
    id: str
    loaded: bool
    changed: bool
    loaded_adapters: list[str]


class ModelList(TypedDict):
    """GET /v1/models."""

    object: Literal["list"]
    data: list[ModelCard]


# -- /v1/responses ----------------------------------------------------------------------------


class OutputText(TypedDict):
    """The text of an output message (no annotations or log probabilities here)."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


#: An output item's state: `in_progress` while a stream writes it.
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputMessage(TypedDict):
    """An output item: the model's text."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    status: ItemStatus
    content: list[OutputText]


class OutputFunctionCall(TypedDict):
    """An output item: a call the model made (`arguments` is a JSON object as a string;
    the result comes back as a `function_call_output` input item with its `call_id`)."""

    id: str
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


class InputTokensDetails(TypedDict):
    cached_tokens: int


class OutputTokensDetails(TypedDict):
    reasoning_tokens: int


class ResponseUsage(TypedDict):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(TypedDict):
    reason: Literal["max_output_tokens", "content_filter"]


class TextFormatConfig(TypedDict):
    format: dict[str, Any]


class ResponseObject(TypedDict):
    """POST /v1/responses: the whole answer, and (status `in_progress`, no output yet)
    what a stream's first events carry."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    error: None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputMessage | OutputFunctionCall]
    parallel_tool_calls: bool
    previous_response_id: str | None
    store: bool
    temperature: float | None
    top_p: float | None
    text: TextFormatConfig
    tool_choice: Any
    tools: list[dict[str, Any]]
    truncation: Literal["disabled"]
    metadata: dict[str, Any]
    usage: ResponseUsage | None


class ResponseLifecycleEvent(TypedDict):
    """A stream's `response.created`, `response.in_progress`, and its last event:
    `response.completed`, or `response.incomplete` (at the token limit)."""

    type: Literal[
        "response.created", "response.in_progress", "response.completed", "response.incomplete"
    ]
    sequence_number: int
    response: ResponseObject


class ResponseItemEvent(TypedDict):
    """`response.output_item.added` (the item in progress) and `.done` (the item whole)."""

    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int
    output_index: int
    item: OutputMessage | OutputFunctionCall


class ResponsePartEvent(TypedDict):
    """`response.content_part.added` (empty) and `.done` (the whole text)."""

    type: Literal["response.content_part.added", "response.content_part.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class ResponseTextEvent(TypedDict):
    """`response.output_text.delta` (`delta`) and `response.output_text.done` (`text`)."""

    type: Literal["response.output_text.delta", "response.output_text.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: NotRequired[str]
    text: NotRequired[str]
    logprobs: list[Any]


class ResponseArgumentsEvent(TypedDict):
    """`response.function_call_arguments.delta` (`delta`) and `.done` (`arguments`)."""

    type: Literal["response.function_call_arguments.delta", "response.function_call_arguments.done"]
    sequence_number: int
    item_id: str
    output_index: int
    delta: NotRequired[str]
    name: NotRequired[str]
    arguments: NotRequired[str]


class ResponseErrorEvent(TypedDict):
    """The event that ends a stream an error cut."""

    type: Literal["error"]
    sequence_number: int
    code: str
    message: str
    param: str | None


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
    prompt_eval_cached_count: NotRequired[int]
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


# -- embeddings ------------------------------------------------------------------------------


class EmbeddingUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class EmbeddingItem(TypedDict):
    """One input's vector: floats, or (`encoding_format` base64) its float32 bytes,
    little-endian, in base64."""

    object: Literal["embedding"]
    embedding: list[float] | str
    index: int


class EmbeddingList(TypedDict):
    """POST /v1/embeddings."""

    object: Literal["list"]
    data: list[EmbeddingItem]
    model: str
    usage: EmbeddingUsage


class OllamaEmbed(TypedDict):
    """POST /api/embed: one vector an input; durations in nanoseconds, as Ollama's."""

    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class OllamaEmbedding(TypedDict):
    """POST /api/embeddings (Ollama's older route): one prompt's vector."""

    embedding: list[float]


# -- health ----------------------------------------------------------------------------------


class Health(ModelDescription, total=False):
    """GET /healthz (with `alive: true`) and /readyz (200 when `status` is `ready`, else
    503): the model's state and description, and the requests being answered."""

    status: Required[Literal["loading", "ready", "restarting", "failed", "draining"]]
    active: int
    waiting: int
    alive: bool
    #: With several models served, each one's status, description and `expires_at`.
    models: list[dict[str, Any]]
    #: With several models served: the memory budget, and what the loaded ones take by
    #: the sizing formula (the server's runtime included).
    memory_budget_mib: int
    memory_held_mib: int


# -- Anthropic's Messages API --------------------------------------------------------------

#: How an Anthropic answer ended: the model's end, the token limit, a stop sequence, a
#: tool call, or the content filter (`refusal`).
AnthropicStop = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"]


class AnthropicUsage(TypedDict):
    """A message's tokens: `input_tokens` are the prompt's beyond those the prompt cache
    held (`cache_read_input_tokens`), as Anthropic counts them."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int


class AnthropicText(TypedDict):
    type: Literal["text"]
    text: str


class AnthropicToolUse(TypedDict):
    """A call the model made: `input` is the arguments, an object."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class AnthropicMessage(TypedDict):
    """POST /v1/messages: the whole answer, and (no content yet, no stop reason) what a
    stream's `message_start` carries."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[AnthropicText | AnthropicToolUse]
    stop_reason: AnthropicStop | None
    stop_sequence: str | None
    usage: AnthropicUsage


class AnthropicMessageStart(TypedDict):
    type: Literal["message_start"]
    message: AnthropicMessage


class AnthropicPing(TypedDict):
    type: Literal["ping"]


class AnthropicBlockStart(TypedDict):
    """`content_block_start`: a block opens (a text block empty, a tool_use block with
    an empty `input`)."""

    type: Literal["content_block_start"]
    index: int
    content_block: AnthropicText | AnthropicToolUse


class AnthropicTextDelta(TypedDict):
    type: Literal["text_delta"]
    text: str


class AnthropicJsonDelta(TypedDict):
    """A tool_use block's arguments, as JSON text (the whole of it, in one delta)."""

    type: Literal["input_json_delta"]
    partial_json: str


class AnthropicBlockDelta(TypedDict):
    type: Literal["content_block_delta"]
    index: int
    delta: AnthropicTextDelta | AnthropicJsonDelta


class AnthropicBlockStop(TypedDict):
    type: Literal["content_block_stop"]
    index: int


class AnthropicStopDelta(TypedDict):
    stop_reason: AnthropicStop
    stop_sequence: str | None


class AnthropicMessageDelta(TypedDict):
    """`message_delta`: how the message ended, and its whole usage."""

    type: Literal["message_delta"]
    delta: AnthropicStopDelta
    usage: AnthropicUsage


class AnthropicMessageStop(TypedDict):
    type: Literal["message_stop"]


class AnthropicErrorDetail(TypedDict):
    type: str
    message: str


class AnthropicError(TypedDict):
    """An error's body, and the `error` event that ends a stream an error cut."""

    type: Literal["error"]
    error: AnthropicErrorDetail


class AnthropicTokenCount(TypedDict):
    """POST /v1/messages/count_tokens: the prompt's tokens, as the model sees them."""

    input_tokens: int


#: Every reply shape, by the name the OpenAPI document gives it.
REPLIES: tuple[type, ...] = (
    TextCompletion,
    ChatCompletion,
    ChatCompletionChunk,
    ModelCard,
    ModelList,
    LoraAdapterReply,
    ResponseObject,
    ResponseLifecycleEvent,
    ResponseItemEvent,
    ResponsePartEvent,
    ResponseTextEvent,
    ResponseArgumentsEvent,
    ResponseErrorEvent,
    Generated,
    GeneratedText,
    GeneratedEnd,
    OllamaLine,
    OllamaTags,
    OllamaShow,
    OllamaPs,
    OllamaVersion,
    Health,
    AnthropicMessage,
    AnthropicMessageStart,
    AnthropicPing,
    AnthropicBlockStart,
    AnthropicBlockDelta,
    AnthropicBlockStop,
    AnthropicMessageDelta,
    AnthropicMessageStop,
    AnthropicError,
    AnthropicTokenCount,
    EmbeddingList,
    OllamaEmbed,
    OllamaEmbedding,
)

"""Anthropic's Messages API: POST /v1/messages (its body, its `message` answer and its
stream of named events) and POST /v1/messages/count_tokens.

A request becomes a chat generation, as /v1/chat/completions makes one: `system` is a
system message, text blocks are the turns' text, `tool_use` blocks are an assistant's
calls and `tool_result` blocks their results (core.protocol.tools reads and prompts them,
for every template family), `stop_sequences` are stop strings, cut exactly.

A stream is Anthropic's event sequence, each event named after its type: `message_start`,
`content_block_start`, `ping`, `content_block_delta`s, `content_block_stop`,
`message_delta` (stop reason and usage), `message_stop`; an error after the first byte is
an `error` event. With tools the text is read for calls once it is whole, so a stream
holds it back and sends the calls (`tool_use` blocks, their input as one
`input_json_delta`) or the text whole at the end, as the other chat routes do.

Errors on these paths take Anthropic's shape (`{"type": "error", "error": {...}}`:
core.http, chosen by core.routes.error_shape); the API key may come as `x-api-key`, as
Anthropic's clients send it, or as a bearer token.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic.config import JsonDict

from ortserve.core.errors import InvalidRequestError, OrtServeError
from ortserve.core.generation import (
    Completion,
    GenerationRequest,
    Guidance,
    SamplingOptions,
    TokenLogprob,
)
from ortserve.core.http import anthropic_error, json_response
from ortserve.core.protocol.bodies import (
    TEMPERATURE_DOC,
    TOOL_CHOICE_NEEDS_TOOLS,
    TOP_K_DOC,
    TOP_P_DOC,
    Body,
    GenerationBody,
    JsonSchema,
    TextPart,
    TokenLimit,
    TopK,
    json_guidance,
    parse,
)
from ortserve.core.protocol.openai import check_model
from ortserve.core.protocol.replies import (
    AnthropicMessage,
    AnthropicStop,
    AnthropicText,
    AnthropicTokenCount,
    AnthropicToolUse,
    AnthropicUsage,
)
from ortserve.core.protocol.serving import Event, Reply, Served
from ortserve.core.protocol.tools import (
    MAX_TOOLS,
    Tool,
    ToolPlan,
    function_tool,
    plan_choice,
    with_tools,
)
from ortserve.core.stops import MAX_STOP_STRINGS

if TYPE_CHECKING:  # core.api imports core.routes, which imports this module
    from ortserve.core.api import Api, Context
    from ortserve.core.http import Request, Response

# -- the body ----------------------------------------------------------------------------


class TextBlock(TextPart):
    """A text block (an image block is refused in words: core.protocol.bodies)."""

    accepted = frozenset({"cache_control", "citations"})

    type: Literal["text"]
    text: str


class ToolUseBlock(Body):
    """A call the model made, sent back in an assistant turn (as the client got it)."""

    accepted = frozenset({"cache_control", "caller", "toolset_name"})

    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=64)
    input: dict[str, Any]


class ToolResultBlock(Body):
    """A call's result, for its `tool_use_id`, in a user turn."""

    accepted = frozenset({"cache_control", "toolset_name"})

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | list[TextBlock] = ""
    is_error: bool = False

    def text(self) -> str:
        """The result as text (a failed call's says so first)."""
        content = self.content
        text = content if isinstance(content, str) else "".join(b.text for b in content)
        return f"Error: {text}" if self.is_error else text


_BLOCK_TYPES = ("text", "tool_use", "tool_result")
_SHOWN = 64  # characters of an unknown type an error repeats


def _block_kind(value: Any) -> str:
    kind = str(value.get("type")) if isinstance(value, dict) else "text"
    return "text" if kind == "image" else kind  # TextBlock refuses an image in words


def _known_block(value: Any) -> Any:
    """Refuse, in words, a block of a type this server does not take (an image says the
    model takes none, as on every route)."""
    if not isinstance(value, dict):
        raise ValueError("Input should be an object (a content block)")
    kind = _block_kind(value)
    if kind in _BLOCK_TYPES:
        return value
    raise ValueError(
        f"content block type {kind[:_SHOWN]!r} is not supported here; supported: "
        + ", ".join(_BLOCK_TYPES)
    )


#: A content block: text, a tool call, or a call's result.
Block = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")],
    Discriminator(_block_kind),
    BeforeValidator(_known_block),
]


def _without_blocks(kind: str) -> JsonDict:
    """The schema of a turn whose content holds no block of type `kind`."""
    block: JsonDict = {"properties": {"type": {"const": kind}}, "required": ["type"]}
    return {
        "properties": {
            "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"not": block}}]}
        }
    }


class Message(Body):
    """One turn: the user's (text, tool results) or the assistant's (text, tool calls)."""

    # The schema says which blocks each role's turns take.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"role": {"const": "assistant"}}},
            "then": _without_blocks("tool_result"),
            "else": _without_blocks("tool_use"),
        }
    )

    role: Literal["user", "assistant"]
    content: str | Annotated[list[Block], Field(min_length=1)]

    @model_validator(mode="after")
    def _blocks_of_its_role(self) -> Message:
        wrong = "tool_result" if self.role == "assistant" else "tool_use"
        if not isinstance(self.content, str) and any(b.type == wrong for b in self.content):
            raise ValueError(
                f"{wrong} blocks belong in the other role's turns, not in a {self.role}'s"
            )
        return self

    def as_template_input(self) -> list[dict[str, Any]]:
        """The turn as chat templates take it (core.protocol.tools' OpenAI shape): a user
        turn's tool results are `tool` messages, in their order among its text."""
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        if self.role == "assistant":
            said = "".join(b.text for b in self.content if isinstance(b, TextBlock))
            calls = [
                {
                    "id": b.id,
                    "type": "function",
                    "function": {"name": b.name, "arguments": json.dumps(b.input)},
                }
                for b in self.content
                if isinstance(b, ToolUseBlock)
            ]
            turn: dict[str, Any] = {"role": "assistant", "content": said}
            return [{**turn, "tool_calls": calls}] if calls else [turn]
        out: list[dict[str, Any]] = []
        text: list[str] = []
        for block in self.content:
            if isinstance(block, TextBlock):
                text.append(block.text)
            elif isinstance(block, ToolResultBlock):
                if text:
                    out.append({"role": "user", "content": "".join(text)})
                    text = []
                out.append(
                    {"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()}
                )
        if text:
            out.append({"role": "user", "content": "".join(text)})
        return out


class CustomTool(Body):
    """A client tool: its name, what it does, its input's JSON schema (Anthropic's server
    tools, which Anthropic runs itself, are refused in words)."""

    # Hints for Anthropic's own tool runner and caches: accepted, not used.
    accepted = frozenset(
        {
            "cache_control",
            "allowed_callers",
            "defer_loading",
            "eager_input_streaming",
            "input_examples",
        }
    )

    type: Literal["custom"] | None = None
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    input_schema: JsonSchema
    strict: bool | None = Field(
        default=None, description="false: the input's objects stay open (JSON Schema's)"
    )

    @classmethod
    def _refuse(cls, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind not in (None, "custom"):
            raise ValueError(
                f"tool type {str(kind)[:_SHOWN]!r} is one Anthropic runs itself; this server "
                "takes custom tools only (name, description, input_schema)"
            )

    def as_tool(self) -> Tool:
        """The chat API's tool (core.protocol.tools)."""
        return function_tool(self.name, self.description, self.input_schema, self.strict)


class ToolChoice(Body):
    """`auto` (the model decides), `any` (it must call one), `tool` (it must call `name`),
    or `none` (no calls)."""

    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"type": {"const": "tool"}}},
            "then": {"required": ["name"], "properties": {"name": {"type": "string"}}},
        }
    )

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = Field(
        default=False, description="accepted; a constrained call is one call per turn"
    )

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("a tool_choice of type tool needs the tool's name")
        return self


class Thinking(Body):
    """Extended thinking: `disabled` only (this server's models answer without it)."""

    accepted = frozenset({"budget_tokens"})

    type: Literal["disabled"]

    @classmethod
    def _refuse(cls, data: dict[str, Any]) -> None:
        if data.get("type") != "disabled":
            raise ValueError(
                "extended thinking is not supported by this server: leave thinking out, "
                "or send its type disabled"
            )


class JsonFormat(Body):
    """`output_config.format`: JSON valid against `schema` (structured output)."""

    type: Literal["json_schema"]
    schema_: JsonSchema = Field(alias="schema")


class OutputConfig(Body):
    """`output_config`: the output's format; `effort` is accepted (a small model has one)."""

    accepted = frozenset({"effort"})

    format: JsonFormat | None = None


def _stop_sequences(value: Any) -> Any:
    """Say what is wrong with stop sequences in words."""
    if isinstance(value, list):
        if len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"give at most {MAX_STOP_STRINGS} stop sequences, not {len(value)}")
        if any(item == "" for item in value):
            raise ValueError("a stop sequence cannot be empty")
    return value


class ConversationBody(Body):
    """What both routes read: the model, the system prompt, the turns and the tools."""

    # Anthropic's fields that ask nothing of the generation (bookkeeping, its own region,
    # speed and cache markers: this server's prompt cache needs none): accepted, not used.
    accepted: ClassVar[frozenset[str]] = frozenset(
        {"metadata", "service_tier", "cache_control", "inference_geo", "speed", "diagnostics"}
    )

    model: str | None = Field(default=None, description="the served model's name")
    messages: list[Message] = Field(min_length=1, description="the turns, oldest first")
    system: str | list[TextBlock] | None = Field(default=None, description="a system prompt")
    tools: list[CustomTool] | None = Field(
        default=None, max_length=MAX_TOOLS, description="client tools (server tools are refused)"
    )
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None

    @model_validator(mode="after")
    def _ends_with_the_user(self) -> ConversationBody:
        if self.messages[-1].role != "user":
            raise ValueError(
                "the last turn must be the user's: continuing an assistant's turn "
                "(prefill) is not supported by this server"
            )
        return self

    def conversation(self) -> list[dict[str, Any]]:
        """The conversation as chat templates take it, the system prompt first."""
        messages: list[dict[str, Any]] = []
        system = self.system
        if system:
            text = system if isinstance(system, str) else "".join(b.text for b in system)
            messages.append({"role": "system", "content": text})
        for message in self.messages:
            messages += message.as_template_input()
        return messages

    def tool_plan(self, served: Served) -> ToolPlan | None:
        """How this request's tools are prompted, constrained and read (None: no tools,
        or tool_choice none).

        Raises:
            InvalidRequestError: tool_choice without tools, or naming another tool.
        """
        choice = self.tool_choice
        tools = [t.as_tool() for t in self.tools] if self.tools else None
        if choice is None or choice.type == "auto":
            return plan_choice(tools, None if choice is None else "auto", served)
        if choice.type == "tool":
            assert choice.name is not None  # ToolChoice says so
            return plan_choice(tools, choice.name, served, "tool_choice.name")
        return plan_choice(tools, "required" if choice.type == "any" else "none", served)

    def chat(
        self,
        served: Served,
        options: SamplingOptions,
        stop: Sequence[str] = (),
        guidance: Guidance | None = None,
    ) -> GenerationRequest:
        """The chat generation of this conversation, with `options`, `stop` and an output
        constraint (`guidance`).

        Raises:
            InvalidRequestError: Another model, or a constraint beside a forced call.
        """
        check_model(served, self.model)
        plan = self.tool_plan(served)
        if guidance is not None and plan is not None and plan.guidance() is not None:
            where = "output_config.format"
            raise InvalidRequestError(
                f"{where} cannot be combined with a required tool call", where
            )
        messages, guidance, tools = with_tools(plan, self.conversation(), guidance)
        return GenerationRequest(
            messages=messages,
            options=options,
            stop=tuple(stop),
            guidance=guidance,
            limit_field="max_tokens",
            tools=tools,
        )


#: The OpenAPI rule: a forced call (tool_choice `any` or `tool`) takes no output format.
_FORCED: JsonDict = {
    "if": {
        "properties": {
            "tool_choice": {
                "type": "object",
                "properties": {"type": {"enum": ["any", "tool"]}},
                "required": ["type"],
            }
        },
        "required": ["tool_choice"],
    },
    "then": {
        "properties": {
            "output_config": {
                "anyOf": [
                    {"type": "null"},
                    {"type": "object", "properties": {"format": {"type": "null"}}},
                ]
            }
        }
    },
}


class MessagesBody(ConversationBody, GenerationBody):
    """POST /v1/messages."""

    model_config = ConfigDict(json_schema_extra={"allOf": [TOOL_CHOICE_NEEDS_TOOLS, _FORCED]})

    max_tokens: TokenLimit = Field(description="the most tokens to generate (required)")
    stop_sequences: Annotated[
        list[Annotated[str, Field(min_length=1)]],
        Field(max_length=MAX_STOP_STRINGS),
        BeforeValidator(_stop_sequences),
    ] = Field(default_factory=list, description="strings that end the answer (cut exactly)")
    temperature: float | None = Field(default=None, ge=0.0, le=1.0, description=TEMPERATURE_DOC)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, description=TOP_P_DOC)
    top_k: TopK | None = Field(default=None, description=TOP_K_DOC)
    output_config: OutputConfig | None = None

    def to_generation(self, served: Served) -> GenerationRequest:
        # Unsent sampling fields (None): the model's defaults, as on every route.
        options = SamplingOptions(
            max_new_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            adapter=served.adapter_of(self.model),
        )
        output = self.output_config.format if self.output_config is not None else None
        guidance = None
        if output is not None:
            guidance = json_guidance(dict(output.schema_), "output_config.format.schema")
        return self.chat(served, options, self.stop_sequences, guidance)

    def reply(self, request_id: str, served: Served) -> Reply:
        return MessagesReply(
            f"msg_{uuid.uuid4().hex}", served.answering(self.model), self.tool_plan(served)
        )


class CountTokensBody(ConversationBody):
    """POST /v1/messages/count_tokens: a conversation, not generated."""

    model_config = ConfigDict(json_schema_extra=TOOL_CHOICE_NEEDS_TOOLS)


# -- the answer --------------------------------------------------------------------------


def _usage(done: Completion | None, prompt_tokens: int = 0) -> AnthropicUsage:
    """The usage of an answer (None: of a stream that has not started its text)."""
    if done is None:
        return {
            "input_tokens": prompt_tokens,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
    return {
        "input_tokens": done.prompt_tokens - done.cached_tokens,
        "output_tokens": done.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": done.cached_tokens,
    }


def _text(text: str) -> AnthropicText:
    return {"type": "text", "text": text}


class MessagesReply(Reply):
    """A `message`, or its stream of named events (no `[DONE]`)."""

    done_marker = False
    named_events = True

    def __init__(self, message_id: str, model: str, tools: ToolPlan | None) -> None:
        self.message_id = message_id
        self.model = model
        self.tools = tools
        self._prompt_tokens = 0

    def _message(self, done: Completion | None) -> AnthropicMessage:
        content: list[AnthropicText | AnthropicToolUse] = []
        stop: AnthropicStop | None = None
        if done is not None:
            content, stop = self._content(done)
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": done.stop_sequence
            if done is not None and stop == "stop_sequence"
            else None,
            "usage": _usage(done, self._prompt_tokens),
        }

    def _content(
        self, done: Completion
    ) -> tuple[list[AnthropicText | AnthropicToolUse], AnthropicStop]:
        """The answer's blocks, and why it ended."""
        calls = self.tools.parse(done.text) if self.tools is not None else []
        if calls:
            uses: list[AnthropicText | AnthropicToolUse] = [
                {
                    "type": "tool_use",
                    "id": f"toolu_{c.id.removeprefix('call_')}",
                    "name": c.name,
                    "input": json.loads(c.arguments),
                }
                for c in calls
            ]
            return uses, "tool_use"
        reason = done.finish_reason
        stop: AnthropicStop
        if reason == "content_filter":
            stop = "refusal"
        elif reason == "stop":
            stop = "stop_sequence" if done.stop_sequence is not None else "end_turn"
        else:
            stop = "max_tokens"
        return [_text(done.text)], stop

    def body(self, done: Completion) -> Event:
        return self._message(done)

    def opened(self, prompt_tokens: int) -> None:
        self._prompt_tokens = prompt_tokens

    def first_events(self) -> Sequence[Event]:
        events: list[Event] = [{"type": "message_start", "message": self._message(None)}]
        if self.tools is None:
            events.append(self._block_start(0, _text("")))
        return [*events, {"type": "ping"}]

    @staticmethod
    def _block_start(index: int, block: AnthropicText | AnthropicToolUse) -> Event:
        return {"type": "content_block_start", "index": index, "content_block": block}

    def delta(self, text: str, logprobs: list[TokenLogprob] | None = None) -> Event | None:
        if self.tools is not None or not text:
            return None  # with tools: held back until the whole text says what it is
        return {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": text},
        }

    def final_events(self, done: Completion) -> Sequence[Event]:
        whole = self._message(done)
        events: list[Event] = []
        if self.tools is None:
            events.append({"type": "content_block_stop", "index": 0})
        else:  # held back: each block whole now
            for index, block in enumerate(whole["content"]):
                if block["type"] == "tool_use":
                    events.append(self._block_start(index, {**block, "input": {}}))
                    delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                else:
                    events.append(self._block_start(index, _text("")))
                    delta = {"type": "text_delta", "text": block["text"]}
                events.append({"type": "content_block_delta", "index": index, "delta": delta})
                events.append({"type": "content_block_stop", "index": index})
        ending = {"stop_reason": whole["stop_reason"], "stop_sequence": whole["stop_sequence"]}
        events.append({"type": "message_delta", "delta": ending, "usage": whole["usage"]})
        return [*events, {"type": "message_stop"}]

    def error_event(self, exc: OrtServeError) -> Event:
        return anthropic_error(exc)


# -- the routes' answers (core.routes) ---------------------------------------------------


def messages(api: Api, request: Request, ctx: Context) -> Response:
    """POST /v1/messages."""
    return api.generate(MessagesBody, request, ctx)


def count_tokens(api: Api, request: Request, ctx: Context) -> Response:
    """POST /v1/messages/count_tokens: the conversation's prompt tokens, tools included,
    as the model's template renders them (nothing is generated)."""
    body = parse(CountTokensBody, request.body)
    service, served = api.service_of(request, ctx, body.model)
    generation = body.chat(served, SamplingOptions(max_new_tokens=1))
    counted: AnthropicTokenCount = {"input_tokens": len(service.engine.prompt_ids(generation))}
    return json_response(200, counted)

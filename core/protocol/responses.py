"""OpenAI's Responses API: POST /v1/responses, its body and its answers (the `response`
object, and the stream's `response.*` events, each with its `sequence_number`).

A request becomes a chat generation, as /v1/chat/completions makes one: `instructions`
is a system message, the input items are the conversation (`function_call` and
`function_call_output` items are the calls and results of core.protocol.tools), and
function tools go through the same tool plan.

`previous_response_id` continues a conversation this process answered for the same
tenant (API key, core.tenants): recent responses (those with `store` true, the default)
are kept in memory, each as its conversation in text (input items and output, not the
instructions, which OpenAI does not carry over either), at most KEPT_RESPONSES of them
and KEPT_RESPONSE_BYTES in all. Any other id (evicted, answered by another instance, or
kept for another tenant) is the same 400, which says to send the whole conversation: it
tells nothing of other tenants' responses.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Discriminator, Field, PrivateAttr, Tag
from pydantic.config import JsonDict

from ortserve.core.errors import InvalidRequestError, OrtServeError
from ortserve.core.generation import Completion, GenerationRequest, SamplingOptions, TokenLogprob
from ortserve.core.protocol.bodies import (
    SPECULATIVE_DOC,
    TEMPERATURE_DOC,
    TOOL_CHOICE_NEEDS_TOOLS,
    TOP_P_DOC,
    Body,
    GenerationBody,
    JsonSchema,
    TextPart,
    TokenLimit,
    json_guidance,
    when_a_call_is_forced,
)
from ortserve.core.protocol.chat import JsonObjectFormat, TextFormat
from ortserve.core.protocol.openai import OPENAI_ACCEPTED, check_model
from ortserve.core.protocol.replies import (
    IncompleteDetails,
    ItemStatus,
    OutputFunctionCall,
    OutputMessage,
    OutputText,
    ResponseErrorEvent,
    ResponseObject,
    ResponseUsage,
)
from ortserve.core.protocol.serving import Event, Reply, Served, public_finish
from ortserve.core.protocol.tools import (
    MAX_TOOLS,
    Tool,
    ToolPlan,
    function_tool,
    plan_choice,
    with_tools,
)
from ortserve.core.tenants import ANYONE

if TYPE_CHECKING:  # core.api imports core.routes, which imports this module
    from ortserve.core.api import Api, Context
    from ortserve.core.http import Request, Response
    from ortserve.core.protocol.tools import ToolCall

#: How many responses each process keeps for `previous_response_id` (the most recent).
KEPT_RESPONSES = 32
#: The most bytes the kept conversations take in all (their strings and containers, as
#: `conversation_bytes` counts them): the memory formula (core.sizing) counts this much.
#: It is one capacity all tenants share; only lookups are per tenant.
KEPT_RESPONSE_BYTES = 16 << 20

Conversation = tuple[dict[str, Any], ...]


def conversation_bytes(value: Any) -> int:
    """The memory `value` (a conversation: lists and dicts of strings) takes, as
    `sys.getsizeof` counts each object in it: a string of one non-Latin-1 character and a
    megabyte of ASCII is 4 MB, as CPython stores it, not its 1 MB of UTF-8."""
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        size += sum(conversation_bytes(k) + conversation_bytes(v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        size += sum(conversation_bytes(v) for v in value)
    return size


class _Kept:
    """The conversations of recent responses, by tenant and response id: an LRU of at
    most `size` entries and `max_bytes` bytes (`conversation_bytes` of each entry).

    A tenant finds only its own entries: another tenant's id is not there, exactly as an
    id that never was. The bounds are shared capacity: one tenant's new entries may evict
    another's (the least recently used go first), never read them.

    A conversation that continues a kept one shares that one's turns in memory, but is
    counted whole: the count is an upper bound of what the entries hold.
    """

    def __init__(self, size: int, max_bytes: int = KEPT_RESPONSE_BYTES) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, str], tuple[Conversation, int]] = OrderedDict()
        self._bytes = 0

    @property
    def bytes(self) -> int:
        """What the kept conversations count now (`conversation_bytes`)."""
        return self._bytes

    def put(self, tenant: str, response_id: str, messages: Sequence[dict[str, Any]]) -> bool:
        """Keep `messages` as `tenant`'s response `response_id`, evicting the least
        recently used entries (any tenant's) past the bounds; False: larger than
        `max_bytes` alone, not kept."""
        kept = tuple(messages)
        size = conversation_bytes(kept)
        if size > self.max_bytes:
            return False
        with self._lock:
            old = self._items.pop((tenant, response_id), None)
            if old is not None:
                self._bytes -= old[1]
            self._items[(tenant, response_id)] = (kept, size)
            self._bytes += size
            while len(self._items) > self.size or self._bytes > self.max_bytes:
                _, (_, freed) = self._items.popitem(last=False)
                self._bytes -= freed
        return True

    def get(self, tenant: str, response_id: str) -> Conversation | None:
        """`tenant`'s kept response `response_id`, now the most recently used; None:
        none of `tenant`'s (evicted, never kept, or another tenant's)."""
        with self._lock:
            entry = self._items.get((tenant, response_id))
            if entry is None:
                return None
            self._items.move_to_end((tenant, response_id))
            return entry[0]


#: This process's kept responses.
KEPT = _Kept(KEPT_RESPONSES)


# -- the body ----------------------------------------------------------------------------


class InputPart(TextPart):
    """A text part of an input message (`output_text`: an earlier answer sent back); an
    image or file part is refused in words."""

    accepted = frozenset({"annotations", "logprobs"})

    type: Literal["input_text", "output_text"]
    text: str


class InputMessage(Body):
    """A message item (its `type` may be left out); an output message sent back as it
    came (`id`, `status`) is accepted."""

    accepted = frozenset({"id", "status"})

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputPart]

    def as_template_input(self) -> dict[str, Any]:
        """The message as chat templates take it (`developer` is `system`)."""
        content = self.content
        text = content if isinstance(content, str) else "".join(p.text for p in content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class FunctionCallItem(Body):
    """A call the model made, sent back with its result."""

    accepted = frozenset({"id", "status"})

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutput(Body):
    """A call's result, for its `call_id`."""

    accepted = frozenset({"id", "status"})

    type: Literal["function_call_output"]
    call_id: str
    output: str


def _item_kind(value: Any) -> str:
    # A message item's type may be left out, or null (its default).
    kind = value.get("type") if isinstance(value, dict) else None
    return str(kind or "message")


_ITEM_TYPES = ("message", "function_call", "function_call_output")
_ROLES = ("user", "assistant", "system", "developer")
_SHOWN = 64  # characters of an unknown type or role an error repeats


def _known_item(value: Any) -> Any:
    """Refuse, in words, an item of a type (or a message of a role) this server does not
    take, rather than as the `input` union's "Input should be a valid string"."""
    if not isinstance(value, dict):
        raise ValueError("Input should be an object (an input item)")
    kind = _item_kind(value)
    if kind not in _ITEM_TYPES:
        raise ValueError(
            f"item type {kind[:_SHOWN]!r} is not supported here; supported: "
            + ", ".join(_ITEM_TYPES)
        )
    role = value.get("role")
    if kind == "message" and isinstance(role, str) and role not in _ROLES:
        hint = " (a tool's result is a function_call_output item)" if role == "tool" else ""
        raise ValueError(
            f"message role {role[:_SHOWN]!r} is not supported here; supported roles: "
            + ", ".join(_ROLES)
            + hint
        )
    return value


#: An input item: a message, a function call or a call's output.
InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")],
    Discriminator(_item_kind),
    BeforeValidator(_known_item),
]


def _input_kind(value: Any) -> str:
    return "items" if isinstance(value, list) else "text"


def _input_shape(value: Any) -> Any:
    """Refuse an `input` of neither shape as such (not as one member's error, which
    would name the member's tag)."""
    if not isinstance(value, str | list) or value == []:
        raise ValueError("Input should be a string or a list of at least one item")
    return value


class FunctionTool(Body):
    """A function tool, in the Responses API's flat shape."""

    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: JsonSchema | None = None
    strict: bool | None = None

    def as_tool(self) -> Tool:
        """The chat API's tool (core.protocol.tools)."""
        return function_tool(self.name, self.description, self.parameters, self.strict)


class NamedFunctionChoice(Body):
    """`tool_choice` naming one function: the model must call it."""

    type: Literal["function"]
    name: str


class JsonSchemaText(Body):
    """text.format `json_schema`: JSON valid against the schema."""

    accepted = frozenset({"description"})

    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64)
    schema_: JsonSchema = Field(default_factory=dict, alias="schema")
    strict: bool | None = None

    def guidance(self) -> Any:
        """JSON valid against the schema (as chat's response_format json_schema)."""
        return json_guidance(dict(self.schema_), "text.format.schema", self.strict is not False)


class TextConfig(Body):
    """`text`: the output's format."""

    accepted = frozenset({"verbosity"})

    format: Annotated[
        TextFormat | JsonObjectFormat | JsonSchemaText, Field(discriminator="type")
    ] = Field(default_factory=lambda: TextFormat(type="text"))


#: `text` with no format, or the plain text one: what a forced call leaves it.
_PLAIN_TEXT: JsonDict = {
    "anyOf": [
        {"type": "null"},
        {
            "type": "object",
            "properties": {
                "format": {
                    "anyOf": [
                        {"type": "null"},
                        {"type": "object", "properties": {"type": {"const": "text"}}},
                    ]
                }
            },
        },
    ]
}


class ResponsesBody(GenerationBody):
    """POST /v1/responses."""

    # The schema says the rules between fields: tool_choice needs tools, and a required
    # or named call takes no constraining text.format.
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                TOOL_CHOICE_NEEDS_TOOLS,
                when_a_call_is_forced({"properties": {"text": _PLAIN_TEXT}}),
            ]
        }
    )

    # OpenAI's fields that ask nothing of the generation: accepted, not used (`store`
    # is a field here: false keeps nothing).
    accepted = (OPENAI_ACCEPTED - {"store"}) | {
        "truncation",
        "include",
        "reasoning",
        "stream_options",
    }

    model: str | None = None
    input: Annotated[
        Annotated[str, Tag("text")] | Annotated[list[InputItem], Field(min_length=1), Tag("items")],
        # Only the member the value's shape picks reports errors: an item's own (a
        # missing field) rather than the string member's "Input should be a valid string".
        Discriminator(_input_kind),
        BeforeValidator(_input_shape),
    ] = Field(description="a user message, or the conversation's items")
    instructions: str | None = Field(default=None, description="a system message")
    max_output_tokens: TokenLimit | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, description=TEMPERATURE_DOC)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, description=TOP_P_DOC)
    speculative: bool = Field(default=True, description=SPECULATIVE_DOC)
    tools: list[FunctionTool] | None = Field(
        default=None, max_length=MAX_TOOLS, description="function tools (others are refused)"
    )
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    text: TextConfig | None = None
    previous_response_id: str | None = Field(
        default=None,
        max_length=128,  # ids are resp_ and 32 hex digits; the 400 repeats the id it names
        description=f"continue one of the last {KEPT_RESPONSES} responses (at most "
        f"{KEPT_RESPONSE_BYTES >> 20} MiB in all) this process answered for this API key "
        "(kept in memory; others are a 400)",
    )
    store: bool = Field(default=True, description="false: not kept for previous_response_id")
    parallel_tool_calls: bool = Field(
        default=True, description="accepted; a constrained call is one call per turn"
    )

    _conversation: list[dict[str, Any]] | None = PrivateAttr(default=None)

    def conversation(self) -> list[dict[str, Any]]:
        """The conversation as chat templates take it, the instructions left out: the
        previous response's, then the input items.

        Raises:
            InvalidRequestError: previous_response_id names a response not kept here.
        """
        if self._conversation is not None:
            return self._conversation
        messages: list[dict[str, Any]] = []
        if self.previous_response_id is not None:
            kept = KEPT.get(self.tenant, self.previous_response_id)
            if kept is None:
                # The same words for an id of another tenant's as for one that never was.
                raise InvalidRequestError(
                    f"previous_response_id {self.previous_response_id!r} is not kept here: "
                    f"each process keeps the last {KEPT_RESPONSES} responses of its API keys "
                    f"in memory, {KEPT_RESPONSE_BYTES >> 20} MiB in all; "
                    "send the whole conversation as input instead",
                    "previous_response_id",
                )
            messages = list(kept)
        items = (
            [InputMessage(role="user", content=self.input)]
            if isinstance(self.input, str)
            else self.input
        )
        for item in items:
            if isinstance(item, InputMessage):
                messages.append(item.as_template_input())
            elif isinstance(item, FunctionCallOutput):
                messages.append(
                    {"role": "tool", "tool_call_id": item.call_id, "content": item.output}
                )
            else:
                call = {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments},
                }
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                    # A new dict: the last turn may be a kept conversation's own.
                    messages[-1] = {**last, "tool_calls": [*last["tool_calls"], call]}
                else:
                    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        self._conversation = messages
        return messages

    def tool_plan(self, served: Served) -> ToolPlan | None:
        """How this request's tools are prompted, constrained and read (None: no tools,
        or tool_choice none).

        Raises:
            InvalidRequestError: tool_choice without tools, or naming another function.
        """
        choice = self.tool_choice
        tools = [t.as_tool() for t in self.tools] if self.tools else None
        named = choice.name if isinstance(choice, NamedFunctionChoice) else choice
        plan = plan_choice(tools, named, served)
        if plan is None:
            return None
        constrained = self.text is not None and not isinstance(self.text.format, TextFormat)
        if plan.guidance() is not None and constrained:
            where = "text.format"
            raise InvalidRequestError(
                f"{where} cannot be combined with a required tool call", where
            )
        return plan

    def to_generation(self, served: Served) -> GenerationRequest:
        check_model(served, self.model)
        limit = self.max_output_tokens or served.default_new_tokens
        # Unsent sampling fields (None): the model's defaults, as on every route.
        options = SamplingOptions(
            max_new_tokens=limit,
            temperature=self.temperature,
            top_p=self.top_p,
            speculative=self.speculative,
            adapter=served.adapter_of(self.model),
        )
        messages = self.conversation()
        if self.instructions is not None:
            messages = [{"role": "system", "content": self.instructions}, *messages]
        guidance = self.text.format.guidance() if self.text is not None else None
        messages, guidance, tools = with_tools(self.tool_plan(served), messages, guidance)
        return GenerationRequest(
            messages=messages,
            options=options,
            guidance=guidance,
            limit_field="max_output_tokens",
            tools=tools,
        )

    def reply(self, request_id: str, served: Served) -> Reply:
        tools = [t.model_dump(exclude_none=True, by_alias=True) for t in self.tools or []]
        choice = self.tool_choice
        echo: ResponseObject = {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": served.answering(self.model),
            "output": [],
            "parallel_tool_calls": self.parallel_tool_calls,
            "previous_response_id": self.previous_response_id,
            "store": self.store,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "text": {"format": self.text.format.model_dump() if self.text else {"type": "text"}},
            "tool_choice": choice.model_dump() if isinstance(choice, Body) else choice or "auto",
            "tools": tools,
            "truncation": "disabled",
            "metadata": {},
            "usage": None,
        }
        kept = self.conversation() if self.store else None
        return ResponsesReply(echo, self.tool_plan(served), kept, self.tenant)


# -- the answer --------------------------------------------------------------------------


def _usage(done: Completion) -> ResponseUsage:
    return {
        "input_tokens": done.prompt_tokens,
        "input_tokens_details": {"cached_tokens": done.cached_tokens},
        "output_tokens": done.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }


def _text(text: str) -> OutputText:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class ResponsesReply(Reply):
    """A `response` object, or its stream of `response.*` events (no `[DONE]`). With
    tools, the text is read for calls once it is whole: a stream holds it back and sends
    the calls (or the text) as whole items at the end. `kept`: the conversation to keep
    for `previous_response_id`, with the answer added (None: store false), as `tenant`'s."""

    done_marker = False

    def __init__(
        self,
        echo: ResponseObject,
        tools: ToolPlan | None,
        kept: list[dict[str, Any]] | None,
        tenant: str = ANYONE,
    ) -> None:
        self.echo = echo
        self.tools = tools
        self.kept = kept
        self.tenant = tenant
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self._sequence = 0

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _message(self, text: str, status: ItemStatus) -> OutputMessage:
        content = [_text(text)] if status != "in_progress" else []
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content,
        }

    def _output(self, done: Completion) -> tuple[list[OutputMessage | OutputFunctionCall], str]:
        """The answer's output items and its status."""
        calls = self.tools.parse(done.text) if self.tools is not None else []
        if calls:
            return [_function_call(c) for c in calls], "completed"
        status: ItemStatus = "completed" if public_finish(done) == "stop" else "incomplete"
        return [self._message(done.text, status)], status

    def _whole(self, done: Completion) -> ResponseObject:
        output, status = self._output(done)
        whole: ResponseObject = {**self.echo, "output": output, "usage": _usage(done)}
        if status == "incomplete":
            finish = public_finish(done)
            reason: IncompleteDetails = {
                "reason": "content_filter" if finish == "content_filter" else "max_output_tokens"
            }
            whole["status"], whole["incomplete_details"] = "incomplete", reason
        else:
            whole["status"] = "completed"
        if self.kept is not None:
            KEPT.put(self.tenant, whole["id"], [*self.kept, _as_message(output)])
        return whole

    def body(self, done: Completion) -> Event:
        return self._whole(done)

    def first_events(self) -> Sequence[Event]:
        events = [
            self._event("response.created", response=self.echo),
            self._event("response.in_progress", response=self.echo),
        ]
        if self.tools is None:
            events += self._message_opening()
        return events

    def _message_opening(self) -> list[Event]:
        return [
            self._event(
                "response.output_item.added",
                output_index=0,
                item=self._message("", "in_progress"),
            ),
            self._event("response.content_part.added", **self._where(0), part=_text("")),
        ]

    def _where(self, index: int) -> dict[str, Any]:
        return {"item_id": self.message_id, "output_index": index, "content_index": 0}

    def delta(self, text: str, logprobs: list[TokenLogprob] | None = None) -> Event | None:
        if self.tools is not None:
            return None  # held back until the whole text says whether it is a call
        return self._event("response.output_text.delta", **self._where(0), delta=text, logprobs=[])

    def final_events(self, done: Completion) -> Sequence[Event]:
        whole = self._whole(done)
        events: list[Event] = []
        for index, item in enumerate(whole["output"]):
            if item["type"] == "function_call":
                events += self._call_events(index, item)
                continue
            text = item["content"][0]["text"]
            if self.tools is not None:  # held back: sent whole now
                events += self._message_opening()
                events.append(
                    self._event(
                        "response.output_text.delta", **self._where(index), delta=text, logprobs=[]
                    )
                )
            events += [
                self._event(
                    "response.output_text.done", **self._where(index), text=text, logprobs=[]
                ),
                self._event("response.content_part.done", **self._where(index), part=_text(text)),
                self._event("response.output_item.done", output_index=index, item=item),
            ]
        last = "response.completed" if whole["status"] == "completed" else "response.incomplete"
        return [*events, self._event(last, response=whole)]

    def _call_events(self, index: int, item: OutputFunctionCall) -> list[Event]:
        opened: OutputFunctionCall = {**item, "arguments": "", "status": "in_progress"}
        where = {"item_id": item["id"], "output_index": index}
        return [
            self._event("response.output_item.added", output_index=index, item=opened),
            self._event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
            self._event(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["arguments"],
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def error_event(self, exc: OrtServeError) -> ResponseErrorEvent:
        event: ResponseErrorEvent = {
            "type": "error",
            "sequence_number": self._sequence,
            "code": exc.code,
            "message": exc.message,
            "param": getattr(exc, "param", None),
        }
        self._sequence += 1
        return event


def _function_call(call: ToolCall) -> OutputFunctionCall:
    return {
        "id": f"fc_{call.id.removeprefix('call_')}",
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    }


def _as_message(output: list[OutputMessage | OutputFunctionCall]) -> dict[str, Any]:
    """The output as the kept conversation's assistant turn: its text, or its calls."""
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        for item in output
        if item["type"] == "function_call"
    ]
    if calls:
        return {"role": "assistant", "content": "", "tool_calls": calls}
    text = "".join(i["content"][0]["text"] for i in output if i["type"] == "message")
    return {"role": "assistant", "content": text}


# -- the route's answer (core.routes) ----------------------------------------------------


def responses(api: Api, request: Request, ctx: Context) -> Response:
    """POST /v1/responses: as the request's tenant (`previous_response_id` looks among,
    and the answer is kept with, that tenant's responses)."""
    return api.generate(ResponsesBody, request, ctx)

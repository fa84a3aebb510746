"""The OpenAI-compatible chat API: POST /v1/chat/completions, its body (messages, tools,
response formats) and its answers (chat completion objects and stream chunks as OpenAI's
API returns them)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field

from ortserve.core.errors import InvalidRequestError
from ortserve.core.generation import (
    Completion,
    GenerationRequest,
    Guidance,
    TokenLogprob,
)
from ortserve.core.http import Request, Response
from ortserve.core.protocol.bodies import (
    NO_MINIMUM,
    NO_MINIMUM_PROPERTIES,
    TOOL_CHOICE_NEEDS_TOOLS,
    Body,
    JsonSchema,
    TextPart,
    TokenLimit,
    integral,
    json_guidance,
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
    OpenAIFinish,
    TopLogprob,
)
from ortserve.core.protocol.serving import Reply, Served, public_finish
from ortserve.core.protocol.tools import MAX_TOOLS, Tool, ToolPlan, plan_tools, with_tools

if TYPE_CHECKING:  # core.api imports core.routes, which imports this module
    from ortserve.core.api import Api, Context

from ortserve.core.protocol.openai import OpenAIBody, OpenAIReply, ReplyHeader, usage_of


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


class ChatBody(OpenAIBody):
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
            ReplyHeader(f"chatcmpl-{request_id}", int(time.time()), served.answering(self.model)),
            f"fp_{served.digest[:12]}",
            self._include_usage,
            served.token_bytes if self.logprobs else None,
            self.tool_plan(served),
        )


class ChatReply(OpenAIReply):
    """A `chat.completion` object, or its `chat.completion.chunk`s. With tools, the text
    is read for calls once it is whole: a stream holds its text back and ends with the
    calls as `delta.tool_calls` chunks (as OpenAI streams them) or with the text."""

    def __init__(
        self,
        header: ReplyHeader,
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
        chunk["usage"] = usage_of(dones)
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
            "usage": usage_of(dones),
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


# -- the route's answer (core.routes) ----------------------------------------------------


def chat_completions(api: Api, request: Request, ctx: Context) -> Response:
    """POST /v1/chat/completions."""
    return api.generate(ChatBody, request, ctx)

"""What a route's format knows of the server (`Served`), and how it answers one
generation (`Reply`: a JSON body, or the events of a stream)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from ortserve.core.errors import OrtServeError
from ortserve.core.generation import (
    HOUSE_SAMPLING,
    Completion,
    SamplingDefaults,
    TokenLogprob,
)
from ortserve.core.http import error_payload
from ortserve.core.names import same_name

if TYPE_CHECKING:  # core.protocol.tools imports core.protocol.bodies, which imports this
    from ortserve.core.protocol.replies import SamplingCard
    from ortserve.core.protocol.tools import ToolPlan


@dataclass(frozen=True)
class Served:
    """What a request's format needs to know of the server.

    Attributes:
        model: The served model's id (the first of the names it is served under).
        digest: Its manifest's sha256 (the system fingerprint).
        created_at: When it was baked (ISO 8601).
        max_new_tokens: The most new tokens a request may ask for (MAX_NEW_TOKENS, or
            the model's context where the operator set none).
        default_new_tokens: What "as many as fit" gives a request that sets no limit
            (OpenAI's chat, Ollama's `num_predict` -1).
        context_length: The model's context in tokens (0: unknown).
        chat_template: The model's chat template (None: it has none).
        precision: Its weights' precision (int4, ...).
        size: The baked folder's size in bytes.
        token_bytes: The bytes a token id stands for (for log probabilities).
        aliases: Its other names, listed after the id (/v1/models, /api/tags).
        also_known_as: Names it answers to but that are not listed (the manifest's model
            name, where the model is served under another).
        sampling: What a request that sends no sampling fields samples with.
    """

    model: str
    digest: str
    created_at: str
    max_new_tokens: int
    default_new_tokens: int
    context_length: int = 0
    chat_template: str | None = None
    precision: str = ""
    size: int = 0
    token_bytes: Callable[[int], bytes] = field(default=lambda token_id: b"", repr=False)
    aliases: tuple[str, ...] = ()
    also_known_as: tuple[str, ...] = ()
    sampling: SamplingDefaults = HOUSE_SAMPLING
    adapters: tuple[str, ...] = ()
    #: The operator set MAX_NEW_TOKENS (a limit above it is refused, not cut to fit).
    limit_set: bool = False
    #: `embedding`: an embedding model (its context is `max_tokens`; it generates nothing).
    kind: Literal["generative", "embedding"] = "generative"
    #: An embedding model's vector length.
    dimensions: int = 0

    def sampling_card(self) -> SamplingCard:
        """The sampling defaults, as /v1/models states them."""
        d = self.sampling
        return {
            "temperature": d.temperature,
            "top_p": d.top_p,
            "top_k": d.top_k,
            "repetition_penalty": d.repetition_penalty,
            "origin": d.origin,
        }

    @property
    def names(self) -> tuple[str, ...]:
        """Every name listed for it, its id first, then `MODEL:ADAPTER` for each LoRA
        adapter baked beside it."""
        return (self.model, *self.aliases, *(f"{self.model}:{a}" for a in self.adapters))

    def answering(self, name: str | None) -> str:
        """The `model` an answer to a request for `name` states: the model's id, or
        `MODEL:ADAPTER` for a LoRA adapter's (as vLLM answers)."""
        adapter = self.adapter_of(name)
        return self.model if adapter is None else f"{self.model}:{adapter}"

    def adapter_of(self, name: str | None) -> str | None:
        """The LoRA adapter a request's `model` names (`MODEL:ADAPTER`; None: the model
        alone, or another model)."""
        listed = self.named(name)
        if listed is None or not self.adapters:
            return None
        head, _, tail = listed.rpartition(":")
        return tail if head == self.model and tail in self.adapters else None

    def named(self, name: str | None) -> str | None:
        """The listed name that `name` (a request's `model`) stands for: any of its names or
        unlisted names in any case, with or without Ollama's `:latest`; a missing or empty
        one means the one model, as llama-server reads it. None: another model."""
        if name is None or not name.strip():
            return self.model
        for known in (*self.names, *self.also_known_as):
            if same_name(name, known):
                return known if known in self.names else self.model
        return None

    @property
    def created(self) -> int:
        """When it was baked, in Unix seconds."""
        return int(datetime.fromisoformat(self.created_at).timestamp())


#: One JSON object a reply sends: a whole answer, or an event of a stream. Each route's
#: own shapes are TypedDicts (core.protocol.replies), published in the OpenAPI document.
Event = Mapping[str, Any]


class Reply(ABC):
    """How a route answers one generation: a JSON body, or the events of a stream."""

    #: How a stream is framed: server-sent events, or one JSON object per line.
    framing: Literal["sse", "ndjson"] = "sse"
    #: A stream ends with `data: [DONE]` (OpenAI's routes).
    done_marker = True
    #: Each SSE event is named after its `type` (`event: message_start`: Anthropic's).
    named_events = False
    #: The request's tools (chat routes that take them), which decide a `tool_calls` ending.
    tools: ToolPlan | None = None

    def error_event(self, exc: OrtServeError) -> Event:
        """The event that ends a stream an error cut (after its first byte)."""
        return error_payload(exc)

    def opened(self, prompt_tokens: int) -> None:
        """A stream's generation was admitted, with a prompt of `prompt_tokens` tokens
        (before `first_events`, which may state it)."""
        return None  # most streams do not state it

    def first_events(self) -> Sequence[Event]:
        """Events sent before the first text."""
        return []

    @abstractmethod
    def delta(self, text: str, logprobs: list[TokenLogprob] | None = None) -> Event | None:
        """The event of one text delta (with its tokens' log probabilities, when asked);
        None: nothing to send for it now (the text is held back)."""

    @abstractmethod
    def final_events(self, done: Completion) -> Sequence[Event]:
        """The events after the last text (finish reason, usage)."""

    @abstractmethod
    def body(self, done: Completion) -> Event:
        """The whole answer of a request that is not streamed."""

    def ending(self, done: Completion) -> str:
        """How the answer ended, for the request's record: the finish reason (`stop`,
        `length`, `cancelled`, `content_filter`; chat with tools: `tool_calls`)."""
        return self.tools.ending(done) if self.tools is not None else done.finish_reason


class MultiChoiceReply(Reply):
    """A reply that can carry several choices of one request (OpenAI's `n`)."""

    def first_events(self, index: int = 0) -> Sequence[Event]:
        """Events sent before choice `index`'s first text."""
        return []

    @abstractmethod
    def delta(
        self, text: str, logprobs: list[TokenLogprob] | None = None, index: int = 0
    ) -> Event | None:
        """The event of one text delta of choice `index` (None: nothing to send now)."""

    @abstractmethod
    def finish_events(self, done: Completion, index: int = 0) -> Sequence[Event]:
        """The events after choice `index`'s last text."""

    @abstractmethod
    def usage_events(self, dones: Sequence[Completion]) -> Sequence[Event]:
        """The events after every choice ended (usage, when asked for)."""

    @abstractmethod
    def bodies(self, dones: Sequence[Completion]) -> Event:
        """The whole answer with every choice."""


def public_finish(done: Completion) -> Literal["stop", "length", "content_filter"]:
    """How an answer ended, as OpenAI's `finish_reason` and Ollama's `done_reason` say it:
    `stop` (an end token or stop string), `content_filter` (the filter ended it; OpenAI's
    own reason), else `length` (the token limit, or a cancelled generation's cut)."""
    if done.finish_reason in ("stop", "content_filter"):
        return done.finish_reason
    return "length"

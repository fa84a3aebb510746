"""The OpenAI-compatible API: what its routes share (`OpenAIBody`, `OpenAIReply`), POST
/v1/completions (its body and its answers: objects and stream chunks as OpenAI's API
returns them), and GET /v1/models and /v1/models/{model}. POST /v1/chat/completions is
core.protocol.chat's."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from ortserve.core.errors import ModelNotFoundError
from ortserve.core.generation import (
    Completion,
    GenerationRequest,
    SamplingOptions,
    TokenLogprob,
)
from ortserve.core.http import Request, Response, json_response
from ortserve.core.protocol.bodies import (
    IGNORE_EOS_DOC,
    MIN_TOKENS_DOC,
    REPETITION_PENALTY_DOC,
    SEED,
    SPECULATIVE_DOC,
    TEMPERATURE_DOC,
    TOP_K_DOC,
    TOP_P_DOC,
    UNAPPLIED,
    Body,
    GenerationBody,
    Int,
    NoBias,
    NoPenalty,
    Seed,
    Stop,
    TokenCount,
    TokenLimit,
    TopK,
    integral,
)
from ortserve.core.protocol.replies import (
    CompletionChoice,
    CompletionLogprobs,
    ModelCard,
    ModelList,
    TextCompletion,
    Usage,
)
from ortserve.core.protocol.serving import Event, MultiChoiceReply, Reply, Served, public_finish

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


class OpenAIBody(GenerationBody):
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
        # The server checks it against its limit (Service.budget); ignore_eos: all of it,
        # and a min_tokens above the limit still says so (it is refused above the server's).
        minimum = max(limit, self.min_tokens) if self.ignore_eos else self.min_tokens
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


def usage_of(dones: Sequence[Completion]) -> Usage:
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
class ReplyHeader:
    """What every object of one answer carries: its id, time, model (and, chat only, the
    system fingerprint)."""

    id: str
    created: int
    model: str


class OpenAIReply(MultiChoiceReply):
    """Shared by both routes: every object carries `header`; with `include_usage`
    (`stream_options.include_usage`), a usage chunk ends a stream; `token_bytes` turns
    token ids into their bytes when log probabilities were asked for."""

    def __init__(
        self,
        header: ReplyHeader,
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


class CompletionBody(OpenAIBody):
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
        header = ReplyHeader(f"cmpl-{request_id}", int(time.time()), served.answering(self.model))
        wants = self.logprobs is not None
        return CompletionReply(header, self._include_usage, served.token_bytes if wants else None)


class CompletionReply(OpenAIReply):
    """A `text_completion` object, or its chunks; log probabilities in the legacy shape
    (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`)."""

    def __init__(
        self,
        header: ReplyHeader,
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
        chunk["usage"] = usage_of(dones)
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
        whole["usage"] = usage_of(dones)
        return whole


# -- the routes' answers (core.routes) ---------------------------------------------------

_MODEL_PREFIX = "/v1/models/"


def completions(api: Api, request: Request, ctx: Context) -> Response:
    """POST /v1/completions."""
    return api.generate(CompletionBody, request, ctx)


def models(api: Api, request: Request, ctx: Context) -> Response:
    """GET /v1/models: the served model, once under each name it is served as."""
    cards = [_model_card(s, name) for s in api.models(request) for name in s.names]
    listing: ModelList = {"object": "list", "data": cards}
    return json_response(200, listing)


def model(api: Api, request: Request, ctx: Context) -> Response:
    """GET /v1/models/{model}: the served model, under the name asked for (an id may hold
    slashes).

    Raises:
        ModelNotFoundError: Another model was named.
    """
    name = request.path.removeprefix(_MODEL_PREFIX)
    served = api.models(request)
    for model in served:
        listed = model.named(name) if name else None
        if listed is not None:
            return json_response(200, _model_card(model, listed))
    have = ", ".join(repr(s.model) for s in served)
    raise ModelNotFoundError(f"the model {name!r} does not exist; this server has {have}")


def _model_card(served: Served, name: str) -> ModelCard:
    """An OpenAI model object for the served model's `name`, with vLLM's `max_model_len`
    (the context; omitted where unknown), `max_tokens`: the most new tokens a request
    may ask for, and the sampling defaults."""
    card: ModelCard = {
        "id": name,
        "object": "model",
        "created": served.created,
        "owned_by": "ortserve",
    }
    if served.kind == "generative":  # an embedding model generates nothing
        card["max_tokens"] = served.max_new_tokens
        card["sampling"] = served.sampling_card()
    if served.context_length:
        card["max_model_len"] = served.context_length
    if served.adapter_of(name) is not None:  # vLLM's: a LoRA adapter's base model
        card["parent"] = served.model
    return card

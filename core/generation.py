"""What a generation asks for and what it gives back: plain data, no engine."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Literal

from ortserve.core.errors import InvalidRequestError
from ortserve.core.stops import MAX_STOP_STRINGS

FinishReason = Literal["stop", "length", "cancelled", "content_filter"]
GuidanceKind = Literal["json_schema", "regex", "lark_grammar"]


@dataclass(frozen=True)
class SamplingDefaults:
    """What the sampling fields a request leaves out (None) become: the model's own
    (its generation_config.json, recorded in the manifest at bake), else `HOUSE_SAMPLING`.

    Attributes:
        temperature: 0 means greedy decoding; above 0 samples.
        top_p: Nucleus sampling mass.
        top_k: Keep the k best tokens (0: no limit).
        repetition_penalty: 1.0 means none.
        origin: Where they come from, as `/v1/models`, `/api/show` and `ortserve show` say.
    """

    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    origin: str = "generation_config.json"

    def summary(self) -> str:
        """One line for people: `greedy, repetition_penalty 1.2 (ortserve's default)`."""
        how = (
            "greedy"
            if self.temperature == 0
            else f"temperature {self.temperature}, top_p {self.top_p}, top_k {self.top_k}"
        )
        return f"{how}, repetition_penalty {self.repetition_penalty} ({self.origin})"


# The profile of a model that records no sampling defaults of its own (SmolLM2's GGUF, a
# checkpoint whose generation_config.json names none): measured on SmolLM2-135M-Instruct
# over the docs' example prompts (docs/measurements.md; why this one: docs/api.md).
HOUSE_SAMPLING = SamplingDefaults(
    temperature=0.0, top_p=1.0, top_k=0, repetition_penalty=1.2, origin="ortserve's default"
)

# transformers' GenerationConfig defaults of the keys `sampling_defaults` reads.
_HF_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "repetition_penalty": 1.0}


def sampling_defaults(config: dict[str, Any]) -> SamplingDefaults | None:
    """The sampling defaults a generation_config.json states, as transformers' generate()
    applies them (`do_sample` true samples with its temperature, top_p and top_k; else
    greedy), or None when it names none of do_sample, temperature, top_p, top_k and
    repetition_penalty."""
    if not config.keys() & {"do_sample", *_HF_SAMPLING}:
        return None
    given = {**_HF_SAMPLING, **{k: config[k] for k in _HF_SAMPLING if config.get(k) is not None}}
    penalty = float(given["repetition_penalty"])
    if not config.get("do_sample") or float(given["temperature"]) == 0:
        return SamplingDefaults(temperature=0.0, repetition_penalty=penalty)
    return SamplingDefaults(
        temperature=float(given["temperature"]),
        top_p=float(given["top_p"]),
        top_k=int(given["top_k"]),
        repetition_penalty=penalty,
    )


@dataclass(frozen=True)
class SamplingOptions:
    """How to pick tokens; a sampling field left None is the model's default
    (`SamplingDefaults`), filled where the engine turns these into og's `EffectiveSampling`.

    Attributes:
        max_new_tokens: Upper bound of new tokens (capped by the context window).
        min_new_tokens: Force at least this many (benchmarks use min = max).
        temperature: 0 means greedy decoding; above 0 samples.
        top_p: Nucleus sampling mass.
        top_k: Keep the k best tokens (0: no limit).
        repetition_penalty: 1.0 means none.
        seed: Random seed for sampling (same seed, same output).
        num_beams: Above 1: beam search with that many beams (deterministic: the
            sampling knobs do not apply; the text comes whole at the end).
        length_penalty: Beam search's exponent on a beam's length (above 1: longer).
        early_stopping: Beam search ends once `num_beams` beams have ended.
        speculative: False: no speculative drafts for this request (plain decoding, one
            token a forward pass), where the server would otherwise speculate.
        adapter: The LoRA adapter to decode with (`MODEL:NAME`'s NAME; None: the model
            alone).
    """

    max_new_tokens: int = 64
    min_new_tokens: int = 0
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool = True
    speculative: bool = True
    adapter: str | None = None


@dataclass(frozen=True)
class Guidance:
    """Constrained decoding: the output must match a JSON schema, a regex or a lark grammar."""

    kind: GuidanceKind
    data: str


@dataclass(frozen=True)
class GenerationRequest:
    """One generation: a prompt or chat messages, sampling options, stop strings, guidance.

    `template_kwargs` are extra chat-template variables (`chat_template_kwargs`);
    `limit_field` is what the caller's API calls the token limit (`max_tokens` on
    OpenAI's routes), so that an error about it names the field the caller sent;
    `logprobs` asks for each new token's log probability and that many alternatives
    (None: none; 0: the token's own only); `tools` are the JSON schemas of the tools the
    chat template is told about. `tenant` is whose request it is and `cache_salt` its own
    prompt-cache scope (core.tenants): the prompt cache and the fault records are kept
    per tenant.
    """

    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] | None = None
    options: SamplingOptions = field(default_factory=SamplingOptions)
    stop: tuple[str, ...] = ()
    guidance: Guidance | None = None
    limit_field: str = "max_new_tokens"
    logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tenant: str = ""
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise InvalidRequestError("give either a prompt or chat messages")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")


@dataclass(frozen=True)
class Timings:
    """Time to the first token (from the start of decoding, after any queue), the time
    after it until the end, and the decode speed after it, in tokens/s."""

    ttft_s: float = 0.0
    decode_s: float = 0.0
    decode_tokens_per_s: float = 0.0


@dataclass(frozen=True)
class TokenLogprob:
    """One new token and how likely the model found it: the log-softmax of the model's
    logits at that position (before temperature, top-k/top-p and penalties).

    Attributes:
        token_id: The token.
        logprob: Its log probability.
        top: The most likely tokens at that position, best first: (id, log probability).
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class LogprobLedger:
    """Pairs the log probabilities of a generation's tokens with the text it has sent:
    a token is released once all of its text has gone out (stop strings hold text back,
    and drop the tokens that formed them)."""

    def __init__(self) -> None:
        self._entries: list[tuple[int, TokenLogprob]] = []  # (end offset in the text, entry)
        self._taken = 0

    def add(self, end: int, entry: TokenLogprob) -> None:
        """A token whose text ends at offset `end` of the generated text."""
        self._entries.append((end, entry))

    def extend_last(self, end: int) -> None:
        """The last token's text goes on to `end` (the decoder flushed its last bytes)."""
        if self._entries:
            self._entries[-1] = (end, self._entries[-1][1])

    def take(self, sent: int) -> list[TokenLogprob]:
        """The tokens not taken yet whose text lies within the first `sent` characters."""
        start = self._taken
        while self._taken < len(self._entries) and self._entries[self._taken][0] <= sent:
            self._taken += 1
        return [entry for _, entry in self._entries[start : self._taken]]

    def within(self, sent: int) -> tuple[TokenLogprob, ...]:
        """Every token whose text lies within the first `sent` characters."""
        return tuple(entry for end, entry in self._entries if end <= sent)


@dataclass(frozen=True)
class Completion:
    """The result of one generation (`logprobs` when the request asked for them;
    `cached_tokens`: prompt tokens the prompt cache held; `filtered`: the content filter's
    rule that ended the output; `redactions`: spans of personal data it replaced;
    `drafts`: speculative decoding's figures, when it was decoded speculatively;
    `stop_sequence`: the stop string that ended it, if one did)."""

    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    timings: Timings
    logprobs: tuple[TokenLogprob, ...] | None = None
    cached_tokens: int = 0
    filtered: str = ""
    redactions: int = 0
    drafts: Drafts | None = None
    stop_sequence: str | None = None


@dataclass(frozen=True)
class Drafts:
    """Speculative decoding so far, for one sequence: draft tokens the model verified, and
    how many of them it accepted (the rest it replaced with its own token)."""

    drafted: int
    accepted: int


@dataclass(frozen=True)
class Token:
    """A new token of a sequence, with its log probability when the request asked for it
    and, when it is decoded speculatively, the sequence's `Drafts` so far."""

    id: int
    logprob: TokenLogprob | None = None
    drafts: Drafts | None = None


@dataclass(frozen=True)
class Cached:
    """How many of the prompt's tokens a kept KV cache held (the prompt cache): said before
    the first token, and only when there were some."""

    tokens: int


@dataclass(frozen=True)
class Finish:
    """The end of a sequence: `eos` (the model, or its grammar, ended it) or `length` (its
    token limit, or the context)."""

    reason: Literal["eos", "length"]


# What a decoding yields, in order: a `Cached` at most, a `Token` per new token, a `Finish`.
DecodeEvent = Token | Cached | Finish


class Decoding:
    """One sequence's decoding, as an iterator of `DecodeEvent`s; the `Finish` is the last, and does
    not come when the decoding is closed before. Closing it stops the decoding and frees what
    it holds (an og Generator and its KV cache, a batch place)."""

    def __init__(
        self, steps: Generator[DecodeEvent, None, None], on_close: Callable[[], None] | None = None
    ) -> None:
        """Yield the records of `steps`; `on_close` runs at `close`, whether or not `steps`
        ever started."""
        self._steps = steps
        self._on_close = on_close

    def __iter__(self) -> Decoding:
        return self

    def __next__(self) -> DecodeEvent:
        return next(self._steps)

    def close(self) -> None:
        """Stop decoding (idempotent)."""
        self._steps.close()
        if self._on_close is not None:
            self._on_close()


class GenerationStream:
    """Text deltas of one generation; `completion` is set once it ends or is closed.

    Closing the stream early (a client gone) stops generation at the next token and
    frees the engine's slot; the completion then says `cancelled`.
    """

    def __init__(
        self,
        deltas: Generator[str, None, None],
        completion: Callable[[], Completion | None],
        on_unstarted_close: Callable[[], None],
        ledger: LogprobLedger | None = None,
        prompt_tokens: int = 0,
    ) -> None:
        """Wrap `deltas`, whose `completion()` is there once they end, however they end
        (and whose tokens' log probabilities go to `ledger`, when asked for);
        `prompt_tokens`: the prompt's length, known before the first delta."""
        self.prompt_tokens = prompt_tokens
        self._deltas = deltas
        self._completion = completion
        self._on_unstarted_close = on_unstarted_close
        self._ledger = ledger
        self._sent = 0

    def take_logprobs(self) -> list[TokenLogprob] | None:
        """The log probabilities of the tokens whose text the deltas so far carried and
        no earlier call returned (None: the request did not ask for them)."""
        return None if self._ledger is None else self._ledger.take(self._sent)

    @property
    def completion(self) -> Completion | None:
        """The result, once the generation has ended (or was cancelled)."""
        return self._completion()

    def __iter__(self) -> GenerationStream:
        return self

    def __next__(self) -> str:
        delta = next(self._deltas)
        self._sent += len(delta)
        return delta

    def close(self) -> None:
        """Stop generating and free the slot (idempotent)."""
        if inspect.getgeneratorstate(self._deltas) == inspect.GEN_CREATED:
            self._on_unstarted_close()
        self._deltas.close()

    def __del__(self) -> None:
        self.close()

    def collect(self) -> Completion:
        """Run to the end and return the completion."""
        for _ in self:
            pass
        assert self.completion is not None  # set by __next__ at StopIteration
        return self.completion


@dataclass(frozen=True)
class EffectiveSampling:
    """How tokens are picked, as og search options, and with which LoRA adapter; requests
    whose `EffectiveSampling` is equal can share a batch (a batch has one set of search options,
    and og 0.18 runs a batch with one adapter)."""

    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    adapter: str | None = None

    @classmethod
    def of(
        cls, options: SamplingOptions, defaults: SamplingDefaults, vocab_size: int
    ) -> EffectiveSampling:
        """`options`, their fields left None taken from `defaults` (each on its own: an
        explicit value always wins, temperature 0 stays greedy)."""

        def pick(value: float | None, default: float) -> float:
            return default if value is None else value

        temperature = pick(options.temperature, defaults.temperature)
        penalty = pick(options.repetition_penalty, defaults.repetition_penalty)
        if temperature == 0:  # greedy: the sampling knobs do not matter
            return cls(0.0, 1.0, 0, penalty, options.adapter)
        top_k = int(pick(options.top_k, defaults.top_k))
        # og rejects a top_k above the vocabulary size; keeping every token is what such a
        # top_k means, and 0 says that to og.
        top_k = 0 if vocab_size and top_k >= vocab_size else top_k
        top_p = pick(options.top_p, defaults.top_p)
        return cls(temperature, top_p, top_k, penalty, options.adapter)

    def search(self) -> dict[str, Any]:
        """The og search options for these (`top_k` 0: no limit); the adapter is
        `Model.generator`'s own argument."""
        search: dict[str, Any] = {
            "do_sample": self.temperature > 0,
            "repetition_penalty": self.repetition_penalty,
        }
        if self.temperature > 0:
            search.update(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        return search

"""The request policy, in one place: admission and the queue, the batching rule, the
token budget, stop strings, the request timeout, cancellation and shutdown, usage and
timings. It takes a plain `GenerationRequest` and returns a `GenerationStream`; it knows
no HTTP (core.api and core.protocol do) and no onnxruntime-genai (core.og_local does).
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ortserve.core.admission import CANCEL_POLL_S, Admission
from ortserve.core.batcher import Alone, Batcher, Sequence
from ortserve.core.content_filter import ContentFilter
from ortserve.core.errors import (
    ClientClosedError,
    DrainingError,
    GenerationError,
    InvalidRequestError,
    OrtServeError,
    RequestTimeoutError,
    first_line,
)
from ortserve.core.generation import (
    Cached,
    Completion,
    DecodeEvent,
    Decoding,
    Drafts,
    EffectiveSampling,
    Finish,
    FinishReason,
    GenerationRequest,
    GenerationStream,
    LogprobLedger,
    SamplingOptions,
    Timings,
    Token,
    TokenLogprob,
)
from ortserve.core.settings import DEFAULT_NEW_TOKENS, EngineSettings
from ortserve.core.stops import StopMatcher
from ortserve.core.tenants import cache_scope

if TYPE_CHECKING:  # onnxruntime-genai comes with the first load, not with this module
    from ortserve.core.engine import Engine


_CACHE_HIT_TOKENS = 64  # prompt tokens the cache must hold for a request to skip batching
# A prefill og takes in one pass (a batch's prompts, a beam search's) may be this many
# prefill parts: batches of short prompts still form, and one pass still stalls the
# process and holds logits for no more than that many parts.
ONE_PASS_PARTS = 4
# A batch's pass beyond that (up to ORTSERVE_BATCH_PREFILL_TOKENS) pads each prompt to the
# longest: it forms only while its padding is at most this many prompt tokens per decode
# step that batching saves (one fewer lone step per row after the first, over the
# smallest limit). Measured on 2 cores, a lone decode step costs what ~6-8 prompt tokens
# of prefill cost, at 0.5B and at 1.5B (a row added to a batch of 1-4 adds a fifth to a
# quarter of a step); 2 leaves room for rows that end early.
PAD_TOKENS_PER_SAVED_STEP = 2
# The limit without MAX_NEW_TOKENS for a model whose config does not give its context.
UNKNOWN_CONTEXT_TOKENS = 4096


@dataclass(frozen=True)
class ChoiceDelta:
    """A text delta of one choice (and its tokens' log probabilities, when asked for)."""

    index: int
    text: str
    logprobs: list[TokenLogprob] | None


class Choices:
    """Several generations of one request, read as one stream of `ChoiceDelta`s in the
    order they come. Each generation is read to its end in a thread of its own, so that
    none waits on another's reader; `completions` holds each one's result at the end.
    Closing (or an error in any choice) ends them all."""

    def __init__(
        self,
        starts: list[Callable[[], GenerationStream]],
        stop: threading.Event,
        cancelled: threading.Event | None,
        release: Callable[[], None] | None = None,
    ) -> None:
        """Run `starts`, whose streams end when `stop` is set; the reader sets it when
        `cancelled` (the client left) is. `release()` once they all have ended (the
        request's slot)."""
        self.completions: list[Completion | None] = [None] * len(starts)
        self._release = release
        self._stop = stop
        self._cancelled = cancelled
        self._queue: queue.SimpleQueue[ChoiceDelta | tuple[int, BaseException | None]]
        self._queue = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._pump, args=(i, start), name=f"choice-{i}", daemon=True)
            for i, start in enumerate(starts)
        ]
        for thread in self._threads:
            thread.start()

    def _pump(self, index: int, start: Callable[[], GenerationStream]) -> None:
        try:
            stream = start()
            try:
                for text in stream:
                    self._queue.put(ChoiceDelta(index, text, stream.take_logprobs()))
            finally:
                stream.close()
                self.completions[index] = stream.completion
        except BaseException as exc:  # handed to the reader, who raises it
            self._queue.put((index, exc))
            return
        self._queue.put((index, None))

    def __iter__(self) -> Iterator[ChoiceDelta | int]:
        """Each choice's deltas as they come, and a choice's index once it has ended.

        Raises:
            OrtServeError: A choice failed (the others are stopped).
        """
        running = len(self._threads)
        try:
            while running:
                try:
                    item = self._queue.get(timeout=CANCEL_POLL_S)
                except queue.Empty:
                    if self._cancelled is not None and self._cancelled.is_set():
                        self._stop.set()  # the client left: every choice ends
                    continue
                if isinstance(item, ChoiceDelta):
                    yield item
                    continue
                index, error = item
                running -= 1
                if error is not None:
                    raise error
                yield index
        finally:
            self.close()

    def close(self) -> None:
        """Stop every choice still generating and wait for their threads (idempotent)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        release, self._release = self._release, None
        if release is not None:
            release()

    def collect(self) -> list[Completion]:
        """Run every choice to its end and return their completions, in order."""
        for _ in self:
            pass
        done = [c for c in self.completions if c is not None]
        assert len(done) == len(self.completions)  # every choice ended without error
        return done


@dataclass(frozen=True)
class Stats:
    """One snapshot of the service, for /healthz and metrics.

    Attributes:
        active: Generations running now (a batch's requests count one each).
        waiting: Requests waiting for a slot.
        batches: Batches decoded since the load (a lone request is a batch of 1; 0 with
            batching off).
        batched_requests: Requests in those batches (÷ batches: the mean batch size).
    """

    active: int
    waiting: int
    batches: int
    batched_requests: int


class _Cuts:
    """What ends or changes a generation's text, in order: the stop strings (cut exactly),
    then the content filter's output rules (deny: the end; redaction)."""

    def __init__(self, stops: StopMatcher, content_filter: ContentFilter | None) -> None:
        self.stops = stops
        self.guard = content_filter.guard() if content_filter is not None else None

    @property
    def ended(self) -> bool:
        """A stop string or a deny rule has ended the text."""
        return self.stops.stopped or (self.guard is not None and self.guard.stopped)

    def feed(self, piece: str) -> str:
        """The text of `piece` that may go out now."""
        text = self.stops.feed(piece)
        return text if self.guard is None else self.guard.feed(text)

    def flush(self) -> str:
        """The text held back, once the tokens have ended."""
        tail = self.stops.flush()
        if self.guard is None:
            return tail
        return self.guard.feed(tail) + self.guard.flush(beyond=self.stops.dropped)

    def finish(self, eos: bool) -> FinishReason:
        """Why the text ended: the filter, a stop string or the model's end, or the limit."""
        if self.guard is not None and self.guard.stopped:
            return "content_filter"
        return "stop" if self.stops.stopped or eos else "length"


class _Answer:
    """One generation's answer, built as its steps come: the text that may go out (`cuts`),
    the tokens (counted, the first one timed; with a `ledger`, each one's log probability
    and where its text ends) and, once it has ended however it ended, its `completion`."""

    def __init__(
        self,
        prompt_tokens: int,
        request: GenerationRequest,
        content_filter: ContentFilter | None,
        redactions: int,
    ) -> None:
        """`redactions`: spans the content filter's input rules replaced."""
        self.cuts = _Cuts(StopMatcher(request.stop), content_filter)
        self.ledger = LogprobLedger() if request.logprobs is not None else None
        self._prompt_tokens = prompt_tokens
        self._redactions = redactions
        self._start = 0.0  # when the tokens were first asked for (`tokens`)
        self._first = 0.0  # seconds from then to the first token
        self._count = 0
        self._cached = 0
        self._drafts: Drafts | None = None
        self._eos = False
        self._new: Token | None = None  # the last token, until its text comes
        self._generated = 0  # characters of text the tokens so far make, before any cut
        self._pieces: list[str] = []
        self._completion: Completion | None = None

    def tokens(self, steps: Iterable[DecodeEvent]) -> Generator[int, None, None]:
        """The new token ids of `steps`, for the detokenizer; the clock starts now."""
        self._start = time.perf_counter()
        return self._ids(steps)

    def _ids(self, steps: Iterable[DecodeEvent]) -> Generator[int, None, None]:
        for step in steps:
            if isinstance(step, Token):
                if not self._count:
                    self._first = time.perf_counter() - self._start
                self._count += 1
                self._new = step
                self._drafts = step.drafts or self._drafts
                yield step.id
            elif isinstance(step, Cached):
                self._cached = step.tokens
            else:
                self._eos = step.reason == "eos"

    def feed(self, piece: str) -> str:
        """The text of the detokenizer's next `piece` that may go out now."""
        self._generated += len(piece)
        if self.ledger is not None:
            if self._new is not None:  # a flush's piece adds no token
                assert self._new.logprob is not None  # asked for: every token has one
                self.ledger.add(self._generated, self._new.logprob)
            else:
                self.ledger.extend_last(self._generated)
        self._new = None
        return self._out(self.cuts.feed(piece))

    def flush(self) -> str:
        """The text held back, once the tokens have ended."""
        return self._out(self.cuts.flush())

    def _out(self, text: str) -> str:
        if text:
            self._pieces.append(text)
        return text

    def end(self, finish: FinishReason) -> None:
        """The generation has ended: make its completion."""
        decode_s = time.perf_counter() - self._start - self._first
        count = self._count
        speed = (count - 1) / decode_s if count > 1 and decode_s > 0 else 0.0
        text = "".join(self._pieces)
        guard = self.cuts.guard
        self._completion = Completion(
            text=text,
            finish_reason=finish,
            prompt_tokens=self._prompt_tokens,
            completion_tokens=count,
            timings=Timings(ttft_s=self._first, decode_s=decode_s, decode_tokens_per_s=speed),
            logprobs=self.ledger.within(len(text)) if self.ledger is not None else None,
            cached_tokens=self._cached,
            filtered=guard.rule if guard is not None else "",
            redactions=self._redactions + (guard.redactions if guard is not None else 0),
            drafts=self._drafts,
            stop_sequence=self.cuts.stops.matched if finish == "stop" else None,
        )

    def finish(self) -> FinishReason:
        """Why the text ended, once the tokens have (see `_Cuts.finish`)."""
        return self.cuts.finish(self._eos)

    def completion(self) -> Completion | None:
        """The result, once the generation has ended (None before)."""
        return self._completion


@dataclass(frozen=True)
class BatchKey:
    """What requests must share to decode as one batch (`Sequence.key`): how tokens are
    picked, and whether EOS is held back until each row's own limit (`to_limit`: a
    request whose minimum is its limit, as `ignore_eos` asks; og's minimum length is one
    for the whole batch)."""

    sampling: EffectiveSampling
    to_limit: bool = False


@dataclass(frozen=True)
class _Prepared:
    """A request ready for a slot: screened, its prompt tokenized, its budget set."""

    request: GenerationRequest
    redactions: int  # spans the content filter's input rules replaced
    input_ids: list[int]
    budget: int


class Service:
    """The model's generations: every request passes here, whatever its route.

    Attributes:
        engine: The loaded model.
        settings: Limits and batching settings.
        admission: The gate every generation passes (slots and the queue).
    """

    def __init__(
        self, engine: Engine, settings: EngineSettings, content_filter: ContentFilter | None = None
    ) -> None:
        """Serve `engine` under `settings`; `content_filter`: the filter file's rules when the
        caller read them already (else read here from `settings.content_filter`)."""
        self.engine = engine
        self.settings = settings
        # MAX_CONCURRENCY generations at once, a batch being one generation.
        self.admission = Admission(
            settings.max_concurrency,
            settings.max_queue,
            settings.queue_timeout_s,
            batch=settings.max_batch,
        )
        # The operator's content filter (ORTSERVE_CONTENT_FILTER), if any.
        path = settings.content_filter
        if content_filter is None and path is not None:
            content_filter = ContentFilter.load(path)
        self.content_filter = content_filter
        self._stopping = threading.Event()
        self._arriving = 0  # requests in `stream` not yet submitted or refused (batch hint)
        self._arriving_lock = threading.Lock()
        self._batcher = (
            Batcher(
                functools.partial(run_batch, engine),
                settings.max_batch,
                settings.batch_window_ms / 1000,
                arriving=lambda: self._arriving,
                fits=self._fits,
            )
            if settings.max_batch > 1
            else None
        )

    @classmethod
    def load(cls, settings: EngineSettings) -> Service:
        """Load the model `settings.model_dir` names (see `Engine.load`) and serve it."""
        from ortserve.core.engine import Engine

        path = settings.content_filter  # a bad filter file fails before the model loads
        content_filter = ContentFilter.load(path) if path is not None else None
        return cls(Engine.load(settings), settings, content_filter)

    def warm_up(self) -> float:
        """Run one short greedy generation (a few prompt tokens, 4 new) straight through
        the engine, so that a user's first request does not pay the first inference's
        one-time costs — with the prompt cache on, the allocation of the kept generator's
        KV buffer, which the first request then reuses; return its seconds. Call it before
        serving (it takes no slot)."""
        start = time.perf_counter()
        engine = self.engine
        ids = engine.encode("Hello, world") or [engine.pad_id]
        options = SamplingOptions(max_new_tokens=4)
        if engine.prompt_cache is not None:
            steps = engine.decode_cached(ids, 4, options)
        else:
            steps = engine.decode(ids, 4, options)
        try:
            for _ in steps:
                pass
        finally:
            steps.close()
        return time.perf_counter() - start

    def stats(self) -> Stats:
        """What the service is doing now and has done since the load."""
        batches, sequences = (
            (self._batcher.batches_run, self._batcher.sequences_run) if self._batcher else (0, 0)
        )
        return Stats(self.admission.active, self.admission.waiting, batches, sequences)

    def stop_generations(self) -> None:
        """End every running generation at its next text with `DrainingError` (the end of
        a shutdown's drain); new ones end at their first."""
        self._stopping.set()

    # -- the token budget ----------------------------------------------------------------

    @property
    def max_new_tokens(self) -> int:
        """The most new tokens a request may ask for: MAX_NEW_TOKENS, or (0, the default)
        the model's context (`UNKNOWN_CONTEXT_TOKENS` where the model does not say it)."""
        return self.settings.max_new_tokens or self.engine.context_length or UNKNOWN_CONTEXT_TOKENS

    @property
    def default_new_tokens(self) -> int:
        """What "as many as fit" means for a request that gives no limit (OpenAI's chat,
        Ollama's `num_predict` -1): MAX_NEW_TOKENS where the operator set it, else
        `DEFAULT_NEW_TOKENS` (within the limit)."""
        return self.settings.max_new_tokens or min(DEFAULT_NEW_TOKENS, self.max_new_tokens)

    def budget(self, prompt_len: int, request: GenerationRequest) -> int:
        """New tokens `request` may have after a prompt of `prompt_len` tokens: its limit,
        capped by the context window. The one place the budget is checked.

        Without MAX_NEW_TOKENS, a limit past the context is cut to what fits after the
        prompt (llama-server's and Ollama's rule; vLLM refuses it), and the answer ends
        with finish_reason `length` there.

        Raises:
            InvalidRequestError: The limit (or `min_tokens`) is above MAX_NEW_TOKENS (or,
                with neither it nor a known context, above `UNKNOWN_CONTEXT_TOKENS`), or
                the prompt is empty, longer than MAX_PROMPT_TOKENS, or leaves no room in
                the context.
        """
        wanted = request.options.max_new_tokens
        limit = self.max_new_tokens
        context = self.engine.context_length
        # Without MAX_NEW_TOKENS a limit past the context is cut to what fits, below.
        if wanted > limit and (self.settings.max_new_tokens or not context):
            field = request.limit_field
            raise InvalidRequestError(
                f"{field} {wanted} is above this server's limit of {limit}", field
            )
        minimum = request.options.min_new_tokens
        if minimum and request.guidance is not None:
            # og holds EOS back while llguidance allows only EOS once the constraint is
            # met: "compute_mask() called after stop" (og 0.18).
            raise InvalidRequestError(
                "min_tokens and ignore_eos cannot be combined with constrained output "
                "(a schema, regex or grammar decides where it ends)",
                "min_tokens",
            )
        # A minimum above the server's limit is refused; a request's own limit as its
        # minimum (ignore_eos) is checked, and cut, as that limit.
        if minimum > limit and minimum != wanted:
            raise InvalidRequestError(
                f"min_tokens {minimum} is above this server's limit of {limit}", "min_tokens"
            )
        if prompt_len == 0:
            raise InvalidRequestError("the prompt is empty")
        prompt_limit = self.settings.max_prompt_tokens
        if prompt_limit and prompt_len > prompt_limit:
            raise InvalidRequestError(
                f"the prompt has {prompt_len} tokens; this server's limit is {prompt_limit}"
            )
        if context and prompt_len >= context:
            raise InvalidRequestError(
                f"the prompt has {prompt_len} tokens; the model's context is {context} "
                "tokens, which leaves no room for new tokens"
            )
        beams = request.options.num_beams
        if beams > 1 and beams * prompt_len > self.one_pass_tokens:
            # og 0.18 prefills a beam search's beams x prompt in one pass (a second
            # append crashes it): its stall and memory are bounded by refusing more.
            raise InvalidRequestError(
                f"a beam search prefills num_beams x prompt tokens at once: {beams} x "
                f"{prompt_len} is above this server's {self.one_pass_tokens} (a shorter "
                "prompt or fewer beams)",
                "num_beams",
            )
        new = min(wanted, context - prompt_len) if context else wanted
        if beams > 1 and beams * (prompt_len + new) > self.beam_positions:
            # Each beam holds a KV cache of prompt + new tokens: together no more than one
            # sequence of the whole context (what the sizing formula counts for a slot).
            raise InvalidRequestError(
                f"a beam search holds num_beams x (prompt + new tokens) positions: {beams} x "
                f"({prompt_len} + {new}) is above this server's {self.beam_positions} "
                f"(fewer beams, or a lower {request.limit_field})",
                "num_beams",
            )
        return new

    @property
    def beam_positions(self) -> int:
        """The most token positions (beams x (prompt + new tokens)) a beam search may
        hold: one sequence of the model's context (`UNKNOWN_CONTEXT_TOKENS` where the
        model does not say it), so that its KV caches fit a slot's memory."""
        return self.engine.context_length or UNKNOWN_CONTEXT_TOKENS

    @property
    def one_pass_tokens(self) -> int:
        """The most prompt tokens (rows x length) og may take in one pass: a batch's, a
        beam search's (`ONE_PASS_PARTS` prefill parts)."""
        return ONE_PASS_PARTS * self.settings.prefill_chunk_tokens

    @property
    def batch_pass_tokens(self) -> int:
        """The most prompt tokens a batch's one pass may take beyond `one_pass_tokens`:
        ORTSERVE_BATCH_PREFILL_TOKENS where og runs in its engine process; 0 where it runs
        in this one, whose GIL the pass would hold (health checks, every stream)."""
        return self.settings.batch_prefill_tokens if self.settings.engine_process else 0

    # -- the prompt cache ----------------------------------------------------------------

    def _cacheable(self, request: GenerationRequest) -> bool:
        """Whether a request may use and refill the prompt cache: unguided, with no
        minimum length, no beams, and a kept generator it can pick its tokens on (any
        sampling; greedy only where the model drafts: `Engine.cache_key`)."""
        options = request.options
        return (
            self.engine.prompt_cache is not None
            and request.guidance is None
            and options.min_new_tokens == 0
            and options.num_beams == 1
            and self.engine.cache_key(options, request.logprobs) is not None
        )

    def _cache_hit(self, input_ids: list[int], budget: int, request: GenerationRequest) -> bool:
        """Whether the cache holds enough of this prompt to run it alone on the kept KV
        cache rather than in a batch (a short shared start is not worth a batch place)."""
        cache = self.engine.prompt_cache
        assert cache is not None
        room = len(input_ids) + budget
        scope = cache_scope(request.tenant, request.cache_salt)
        key = self.engine.cache_key(request.options, request.logprobs)
        held = cache.match(input_ids, room, key, scope)
        return held >= _CACHE_HIT_TOKENS

    # -- the batching rule ---------------------------------------------------------------

    def _batchable(self, request: GenerationRequest) -> bool:
        """Unseeded requests batch, greedy or sampled; seeded and guided ones run alone.

        A seed promises the same output for the same request, whatever else the server
        is doing, and a batch cannot keep that promise even for greedy decoding: besides
        sharing one random generator and one set of search options, a batch's decode
        step multiplies M > 1 rows at once, and on some CPUs onnxruntime's int4
        MatMulNBits (accuracy level 4: int8 compute) rounds those differently from a lone
        request's M = 1 row (x86-64 with AVX2, no AVX-512: logits off by up to ~2.5, so
        near-ties flip; bit-identical with AVX-512 VNNI). So a request with a seed keeps
        a generator of its own, as does one with a grammar or a minimum length below its
        limit (og's minimum is the whole batch's; a minimum that is the limit, as
        `ignore_eos` asks, batches with its like: `BatchKey.to_limit`), one that asks for
        log probabilities (read from its own generator's logits), and a beam search.
        """
        options = request.options
        return (
            self._batcher is not None
            and not self.engine.draft_model  # og 0.18 drafts for one sequence only
            and request.guidance is None
            and options.min_new_tokens in (0, options.max_new_tokens)
            and options.seed is None
            and request.logprobs is None
            and options.num_beams == 1
        )

    def _fits(self, batch: list[Sequence]) -> bool:
        """Whether `batch` decodes each sequence as it would decode alone.

        Only requests with equal sampling options are offered together (the batcher
        matches `Sequence.key`). A prompt that ends with the pad id never shares a batch:
        og (batch_size > 1) takes a row's trailing pad ids for padding and masks them
        (alone, nothing is masked), so its first new token still matches and the next
        ones decode as if the prompt had lost that token. And every sequence must get its
        whole token limit: a batch's prompts are padded to the longest, and the longest
        prompt plus the largest limit must fit the context (else a short request would be
        cut short by a long one).

        A batch's padded prompts go into the model in one pass (og 0.18 cannot append a
        batch in parts): within `one_pass_tokens` (a few parts) a batch always forms;
        beyond it, up to `batch_pass_tokens`, only while its padding costs less
        prefill than batching saves decode steps (`PAD_TOKENS_PER_SAVED_STEP`). Longer
        prompts run alone, in parts (side by side: the batcher starts others beside a
        prefill in parts)."""
        engine = self.engine
        rows = len(batch)
        if rows > 1 and any(s.input_ids[-1] == engine.pad_id for s in batch):
            return False
        lengths = [len(s.input_ids) for s in batch]
        longest = max(lengths)
        padded = rows * longest
        if rows == 1 and padded > self.one_pass_tokens:
            return True  # alone, in parts
        if padded > max(self.one_pass_tokens, self.batch_pass_tokens):
            return False
        saved_steps = (rows - 1) * min(s.max_new for s in batch)
        if padded > self.one_pass_tokens and (
            padded - sum(lengths) > PAD_TOKENS_PER_SAVED_STEP * saved_steps
        ):
            return False
        if not engine.context_length:
            return True
        return longest + max(s.max_new for s in batch) <= engine.context_length

    # -- generation ----------------------------------------------------------------------

    def stream(
        self,
        request: GenerationRequest,
        cancelled: threading.Event | None = None,
        deadline: float | None = None,
    ) -> GenerationStream:
        """Start a generation under admission control; iterate it for text deltas.

        Validation and admission happen here, before the first delta, so that callers
        can still answer with an error status. A set `cancelled` (the client left) ends
        the wait for a slot at once, and the generation at its next text. The generation
        ends with a timeout error at REQUEST_TIMEOUT_S from its start, or at `deadline`
        (`time.monotonic()`, the platform's own limit), whichever comes first.

        Raises:
            InvalidRequestError: Bad parameters, a prompt that does not fit, bad guidance.
            BusyError: No slot within the queue timeout, or the queue is full.
            ClientClosedError: `cancelled` was set before a slot was taken.
        """
        self._arrive(1)
        try:
            prepared = self._prepare(request)
            request, input_ids, budget = prepared.request, prepared.input_ids, prepared.budget
            cache = self._cacheable(request)
            # A prompt the cache holds enough of runs alone, on the kept KV cache.
            batched = self._batchable(request) and not (
                cache and self._cache_hit(input_ids, budget, request)
            )
            self.admission.acquire(batched, cancelled)
        finally:
            self._arrive(-1)
        held_from = time.monotonic()

        def release() -> None:
            self.admission.release(time.monotonic() - held_from, batched)

        return self._start(prepared, batched, self._checker(cancelled, deadline), release)

    def _prepare(self, request: GenerationRequest) -> _Prepared:
        """`request` screened by the content filter's input rules, its prompt's tokens and
        its token budget, checked: everything before a slot is taken.

        Raises:
            As `stream`, but for the slot.
        """
        engine = self.engine
        redactions = 0
        if self.content_filter is not None:
            screened = self.content_filter.screen(request)
            request, redactions = screened.request, screened.redactions
        input_ids = engine.prompt_ids(request)
        budget = self.budget(len(input_ids), request)
        engine.check_admissible(input_ids, request.guidance, request.tenant)
        engine.check_options(request.options)
        return _Prepared(request, redactions, input_ids, budget)

    def _start(
        self,
        prepared: _Prepared,
        batched: bool,
        check: Callable[[], None],
        release: Callable[[], None],
    ) -> GenerationStream:
        """Start the generation `prepared` asks for, in a batch or alone, once its slot is
        taken; `release` frees the slot however the generation ends."""
        engine = self.engine
        request, input_ids, budget = prepared.request, prepared.input_ids, prepared.budget
        try:
            if batched:
                assert self._batcher is not None  # _batchable says so
                options = request.options
                key = BatchKey(engine.sampling(options), to_limit=options.min_new_tokens > 0)
                sequence = Sequence(input_ids, budget, key=key, tenant=request.tenant)
                self._batcher.submit(sequence)
                steps = Decoding(self._batched(sequence, request, check), sequence.leave)
            else:
                steps = self._decode(input_ids, budget, request, check)
        except BaseException:
            release()
            raise
        answer = _Answer(len(input_ids), request, self.content_filter, prepared.redactions)

        def close_unstarted() -> None:
            steps.close()  # the og Generator, or the batch place, goes
            release()

        deltas = self._deltas(steps, answer, check, release)
        return GenerationStream(
            deltas, answer.completion, close_unstarted, answer.ledger, len(prepared.input_ids)
        )

    def generate(self, request: GenerationRequest) -> Completion:
        """Run a whole generation and return its text and figures."""
        return self.stream(request).collect()

    def stream_choices(
        self,
        request: GenerationRequest,
        n: int,
        cancelled: threading.Event | None = None,
        deadline: float | None = None,
    ) -> Choices:
        """Start `n` generations of one request (OpenAI's `n`), side by side: with a seed,
        choice i uses seed + i, so choices differ and each is reproducible.

        The request passes admission once, as one generation: its choices never queue
        against each other (behind a slot one of them holds), whatever the number of
        slots. Within it, at most MAX_BATCH choices decode at once (in one batch when the
        request can batch, else each alone: the memory of one generation's batch), the
        others as those end, all within one request timeout. The first starts
        here, so that a bad request or a full server is an error before any byte.

        Raises:
            As `stream`.
        """
        stop = threading.Event()  # ends every choice: closed, or the client left
        if cancelled is not None and cancelled.is_set():
            stop.set()
        prepared = self._prepare(request)
        self.admission.acquire(False, cancelled)
        held_from = time.monotonic()

        def release() -> None:
            self.admission.release(time.monotonic() - held_from, False)

        options = prepared.request.options
        choices = [
            replace(
                prepared, request=replace(prepared.request, options=replace(options, seed=seed))
            )
            for seed in (
                [options.seed + i for i in range(n)] if options.seed is not None else [None] * n
            )
        ]
        check = self._checker(stop, deadline)  # one time limit for the whole request
        wave = max(1, self.settings.max_batch)
        at_once = threading.BoundedSemaphore(wave)
        # Unseeded choices batch (together: the batcher waits for the first wave's).
        batched = self._batchable(prepared.request)
        coming = min(n, wave) - 1 if batched else 0
        self._arrive(coming)
        try:
            at_once.acquire()
            first = self._start(choices[0], batched, check, at_once.release)
        except BaseException:
            self._arrive(-coming)
            release()
            raise

        def start(index: int, choice: _Prepared) -> GenerationStream:
            try:
                while not at_once.acquire(timeout=CANCEL_POLL_S):
                    check()  # the client left, or the time is up, while it waited
            finally:
                if index <= coming:
                    self._arrive(-1)
            return self._start(choice, batched, check, at_once.release)

        starts: list[Callable[[], GenerationStream]] = [lambda: first]
        starts += [functools.partial(start, i, c) for i, c in enumerate(choices) if i]
        return Choices(starts, stop, cancelled, release)

    def _arrive(self, delta: int) -> None:
        with self._arriving_lock:
            self._arriving += delta

    def _decode(
        self,
        input_ids: list[int],
        max_new: int,
        request: GenerationRequest,
        check: Callable[[], None],
        paused: Callable[[bool], None] | None = None,
    ) -> Decoding:
        """Start one request's decoding, the engine's way for it: beam search, through the
        prompt cache (`_cacheable`), or a plain decode (sampled or guided too); `check`
        runs between the parts of its prefill."""
        engine, options, logprobs = self.engine, request.options, request.logprobs
        tenant = request.tenant
        if options.num_beams > 1:
            return engine.beam_search(input_ids, max_new, options, check, tenant)
        if self._cacheable(request):
            scope = cache_scope(tenant, request.cache_salt)
            return engine.decode_cached(
                input_ids, max_new, options, logprobs, paused, check, tenant, scope
            )
        guidance = request.guidance
        return engine.decode(input_ids, max_new, options, guidance, logprobs, paused, check, tenant)

    def _batched(
        self, sequence: Sequence, request: GenerationRequest, check: Callable[[], None]
    ) -> Generator[DecodeEvent, None, None]:
        """A batched sequence's steps, as `Engine.decode` gives an unbatched one's; `check`
        runs while it waits for its batch."""
        try:
            while True:
                sequence.paused_at = None
                try:  # waiting for a batch, e.g. behind a long prefill: checked as it goes
                    item = sequence.out.get(timeout=CANCEL_POLL_S)
                except queue.Empty:
                    check()
                    continue
                if isinstance(item, Alone):  # a batch of one: run it in this thread
                    alone = self._decode(
                        sequence.input_ids, sequence.max_new, request, check, sequence.pause
                    )
                    try:
                        yield from alone
                    finally:
                        alone.close()
                    return
                if isinstance(item, OrtServeError):  # the engine process ended, say
                    raise item
                if isinstance(item, BaseException):
                    raise GenerationError(f"generation failed: {first_line(item)}") from item
                yield item
                if isinstance(item, Finish):
                    return
        finally:
            sequence.leave()

    def _checker(
        self, cancelled: threading.Event | None, platform_deadline: float | None
    ) -> Callable[[], None]:
        """The check that ends a generation (it raises) whose client left (`cancelled`),
        whose server stops, or whose time is up: REQUEST_TIMEOUT_S from now, or
        `platform_deadline` (`time.monotonic()`) if that comes first."""
        deadline = time.monotonic() + self.settings.request_timeout_s
        by_platform = platform_deadline is not None and platform_deadline < deadline
        if platform_deadline is not None:
            deadline = min(deadline, platform_deadline)
        return functools.partial(self._check, cancelled, deadline, by_platform)

    def _check(self, cancelled: threading.Event | None, deadline: float, by_platform: bool) -> None:
        """End a generation whose client left, whose time is up, or whose server stops."""
        if cancelled is not None and cancelled.is_set():
            raise ClientClosedError("the client closed the request during generation")
        if self._stopping.is_set():
            raise DrainingError(
                "the server shut down before this generation ended; retry on another instance"
            )
        if time.monotonic() > deadline:
            if by_platform:
                raise RequestTimeoutError(
                    "the generation ran up to the platform's time limit for this request "
                    "(ask for fewer tokens, or raise the function's timeout)"
                )
            raise RequestTimeoutError(
                f"the generation ran past the {self.settings.request_timeout_s:g} s request timeout"
            )

    def _deltas(
        self,
        steps: Decoding,
        answer: _Answer,
        check: Callable[[], None],
        release: Callable[[], None],
    ) -> Generator[str, None, None]:
        """Text deltas of `steps`, as `answer` cuts them; `check()` ends the generation
        between them (it raises). However it ends, the decoding and then the slot
        (`release`) are freed, and `answer` makes its completion."""
        ids = answer.tokens(steps)
        finish: FinishReason = "cancelled"
        try:
            check()
            for piece in self.engine.detokenize(ids):
                text = answer.feed(piece)
                if text:
                    yield text
                if answer.cuts.ended:
                    break
                check()
            tail = answer.flush()
            if tail:
                yield tail
            finish = answer.finish()
        finally:
            ids.close()
            steps.close()  # frees the og Generator (its KV cache) before the slot
            release()
            answer.end(finish)


def run_batch(engine: Engine, batch: list[Sequence]) -> None:
    """Run `batch` (the batcher's) through the engine's batch steps, feeding each sequence
    a `Token` a step until its EOS, its limit or its leaving; then a `Finish` to each still
    fed.

    Every sequence's `key` is the `BatchKey` it was batched by (equal in a batch).
    """
    key = batch[0].key
    assert isinstance(key, BatchKey)  # the service batches by it
    counts = [0] * len(batch)
    active = set(range(len(batch)))
    steps = engine.decode_batch(
        [s.input_ids for s in batch],
        max(s.max_new for s in batch),
        key.sampling,
        [s.tenant for s in batch],
        to_limit=key.to_limit,
    )
    try:
        for step in steps:
            for row in sorted(active):
                sequence, token = batch[row], step[row]
                if sequence.cancelled.is_set():
                    active.discard(row)
                elif token in engine.eos_ids:
                    sequence.out.put(Finish("eos"))
                    active.discard(row)
                else:
                    sequence.out.put(Token(token))
                    counts[row] += 1
                    if counts[row] >= sequence.max_new:
                        sequence.out.put(Finish("length"))
                        active.discard(row)
            if not active:
                break
    finally:
        steps.close()  # frees the batch's generator at once
    for row in active:  # the batch's max_length came first
        batch[row].out.put(Finish("length"))

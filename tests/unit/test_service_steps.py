"""The service reads a decoding's typed steps (core.generation: `Cached`, `Token`, `Finish`)
into text and a completion, and hands the engine its checkpoint (#38), with a stand-in
engine (no model). The model-backed tests check the same end to end (test_engine.py,
test_prompt_cache.py, test_long_prompts.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, cast

import pytest

from ortserve.core.errors import ClientClosedError
from ortserve.core.generation import (
    HOUSE_SAMPLING,
    Cached,
    DecodeEvent,
    Decoding,
    EffectiveSampling,
    Finish,
    GenerationRequest,
    SamplingOptions,
    Token,
    TokenLogprob,
)
from ortserve.core.service import Service
from ortserve.core.settings import EngineSettings


class _Engine:
    """Decodes into `steps`; token i's text is the i-th letter."""

    context_length = 100
    pad_id = 0
    eos_ids = frozenset({99})
    prompt_cache = None

    def __init__(self, steps: list[DecodeEvent]) -> None:
        self.steps = steps
        self.checkpoint: Callable[[], None] | None = None
        self.read = 0
        self.closed = False

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        return [5, 6, 7]

    def check_admissible(self, input_ids: list[int], guidance: Any, tenant: str = "") -> None:
        pass

    def check_options(self, options: SamplingOptions) -> None:
        pass

    def sampling(self, options: SamplingOptions) -> EffectiveSampling:
        return EffectiveSampling.of(options, HOUSE_SAMPLING, 0)

    def decode(
        self,
        input_ids: list[int],
        max_new: int,
        options: SamplingOptions,
        guidance: Any,
        logprobs: int | None,
        paused: Callable[[bool], None] | None,
        checkpoint: Callable[[], None] | None,
        tenant: str = "",
    ) -> Decoding:
        self.checkpoint = checkpoint

        def steps() -> Generator[DecodeEvent, None, None]:
            try:
                for step in self.steps:
                    self.read += 1
                    yield step
            finally:
                self.closed = True

        return Decoding(steps())

    def detokenize(self, token_ids: Iterable[int]) -> Iterator[str]:
        return (chr(ord("a") + token) for token in token_ids)


def _service(steps: list[DecodeEvent]) -> tuple[Service, _Engine]:
    engine = _Engine(steps)
    return Service(cast(Any, engine), EngineSettings(max_batch=1)), engine


def test_the_steps_make_the_text_and_the_completion() -> None:
    service, engine = _service([Cached(2), Token(0), Token(1), Finish("eos")])
    done = service.generate(GenerationRequest(prompt="x"))
    assert (done.text, done.finish_reason, done.completion_tokens) == ("ab", "stop", 2)
    assert (done.prompt_tokens, done.cached_tokens) == (3, 2)
    assert engine.closed
    service, _ = _service([Token(0), Finish("length")])
    assert service.generate(GenerationRequest(prompt="x")).finish_reason == "length"


def test_a_stop_string_ends_it_before_the_finish_and_the_cached_count_stays() -> None:
    steps: list[DecodeEvent] = [Cached(3), *(Token(i) for i in range(6)), Finish("length")]
    service, engine = _service(steps)
    done = service.generate(GenerationRequest(prompt="x", stop=("cd",)))
    assert (done.text, done.finish_reason, done.cached_tokens) == ("ab", "stop", 3)
    assert done.completion_tokens == 4 and engine.read == 5 and engine.closed


def test_each_tokens_log_probability_goes_with_its_text() -> None:
    first, second = TokenLogprob(0, -0.5), TokenLogprob(1, -1.5, ((1, -1.5), (4, -2.0)))
    service, _ = _service([Token(0, first), Token(1, second), Finish("eos")])
    done = service.generate(GenerationRequest(prompt="x", logprobs=1))
    assert done.logprobs == (first, second)


def test_the_engine_is_given_the_checkpoint_that_ends_a_cancelled_generation() -> None:
    service, engine = _service([Token(0), Finish("eos")])
    cancelled = threading.Event()
    stream = service.stream(GenerationRequest(prompt="x"), cancelled)
    assert engine.checkpoint is not None
    engine.checkpoint()  # between prefill parts: nothing to stop yet
    cancelled.set()
    with pytest.raises(ClientClosedError):
        engine.checkpoint()
    stream.close()
    assert service.admission.active == 0  # the slot went back

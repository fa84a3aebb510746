"""The service's pure rules with a stand-in engine (no model): the token budget, which
requests batch, and which batches fit (#28 item 7). Model-backed tests check the same
rules end to end (test_engine.py, test_batch_greedy.py, test_long_prompts.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from ortserve.core.batcher import Sequence
from ortserve.core.errors import InvalidRequestError
from ortserve.core.generation import EffectiveSampling, GenerationRequest, Guidance, SamplingOptions
from ortserve.core.service import ONE_PASS_PARTS, UNKNOWN_CONTEXT_TOKENS, Service
from ortserve.core.settings import EngineSettings

PAD = 0
KEY = EffectiveSampling(0.0, 1.0, 0, 1.0)


def _service(context: int = 1000, **settings: Any) -> Service:
    engine = SimpleNamespace(
        context_length=context,
        pad_id=PAD,
        eos_ids=frozenset({2}),
        prompt_cache=None,
        draft_model=False,
    )
    return Service(cast(Any, engine), EngineSettings(**settings))


def _request(max_new: int = 10, **options: Any) -> GenerationRequest:
    return GenerationRequest(prompt="x", options=SamplingOptions(max_new, **options))


def test_the_budget_is_the_limit_capped_by_the_context() -> None:
    service = _service(context=100)
    assert service.budget(10, _request(20)) == 20
    # Without MAX_NEW_TOKENS, a limit past the context is cut to what fits (llama-server).
    assert service.budget(90, _request(50)) == 10
    with pytest.raises(InvalidRequestError, match="leaves no room"):
        service.budget(100, _request(1))
    with pytest.raises(InvalidRequestError, match="empty"):
        service.budget(0, _request(1))


def test_max_new_tokens_and_max_prompt_tokens_refuse_with_the_callers_field() -> None:
    service = _service(max_new_tokens=50, max_prompt_tokens=20)
    request = GenerationRequest(
        prompt="x", options=SamplingOptions(51), limit_field="max_completion_tokens"
    )
    with pytest.raises(InvalidRequestError, match="max_completion_tokens 51") as caught:
        service.budget(5, request)
    assert caught.value.param == "max_completion_tokens"
    with pytest.raises(InvalidRequestError, match="limit is 20"):
        service.budget(21, _request(5))


def test_min_tokens_above_the_limit_is_refused_by_its_name() -> None:
    service = _service(max_new_tokens=50)
    with pytest.raises(InvalidRequestError, match="min_tokens 51 is above") as caught:
        service.budget(5, _request(10, min_new_tokens=51))
    assert caught.value.param == "min_tokens"
    # ignore_eos: the minimum is the request's own limit, checked (and cut) as that.
    assert _service(context=100).budget(90, _request(500, min_new_tokens=500)) == 10


def test_without_a_known_context_the_limit_is_the_unknown_contexts() -> None:
    service = _service(context=0)
    assert service.max_new_tokens == UNKNOWN_CONTEXT_TOKENS
    with pytest.raises(InvalidRequestError, match="above this server's limit"):
        service.budget(5, _request(UNKNOWN_CONTEXT_TOKENS + 1))


def test_a_beam_search_is_bounded_by_one_pass() -> None:
    service = _service(prefill_chunk_tokens=64)
    one_pass = ONE_PASS_PARTS * 64
    assert service.one_pass_tokens == one_pass
    assert service.budget(one_pass // 4, _request(5, num_beams=4)) == 5
    with pytest.raises(InvalidRequestError, match="num_beams") as caught:
        service.budget(one_pass // 4 + 1, _request(5, num_beams=4))
    assert caught.value.param == "num_beams"


def test_a_beam_search_holds_at_most_one_contexts_positions() -> None:
    # 8 beams x 4,000 new tokens (issue 49) held the engine for minutes: refused first.
    service = _service(context=1000, prefill_chunk_tokens=64)
    assert service.beam_positions == 1000
    assert service.budget(20, _request(105, num_beams=8)) == 105  # 8 x 125 = 1,000
    with pytest.raises(InvalidRequestError, match=r"8 x \(20 \+ 106\)") as caught:
        service.budget(20, _request(106, num_beams=8))
    assert caught.value.param == "num_beams"
    assert service.budget(20, _request(106)) == 106  # one sequence: the context bounds it


def test_only_unseeded_unguided_plain_requests_batch() -> None:
    service = _service()
    assert service._batchable(_request())
    assert service._batchable(_request(temperature=0.8))  # sampled, unseeded: batches
    assert not service._batchable(_request(seed=1))
    assert not service._batchable(_request(min_new_tokens=2))  # og's minimum is the batch's
    assert service._batchable(_request(10, min_new_tokens=10))  # ignore_eos: with its like
    assert not service._batchable(_request(num_beams=2))
    guided = GenerationRequest(prompt="x", guidance=Guidance("regex", "a+"))
    assert not service._batchable(guided)
    assert not service._batchable(GenerationRequest(prompt="x", logprobs=0))
    assert not _service(max_batch=1)._batchable(_request())  # batching off


def test_a_batch_fits_when_each_row_decodes_as_alone() -> None:
    service = _service(context=100, prefill_chunk_tokens=16)

    def rows(*shapes: tuple[int, int]) -> list[Sequence]:
        return [Sequence([5] * length, max_new, key=KEY) for length, max_new in shapes]

    assert service._fits(rows((10, 10), (20, 30)))
    # A prompt ending with the pad id would be masked in a batch: never shares one.
    padded = [Sequence([5, PAD], 5, key=KEY), *rows((3, 5))]
    assert not service._fits(padded) and service._fits(padded[:1])
    # The longest prompt plus the largest limit must fit the context.
    assert not service._fits(rows((60, 10), (10, 41)))
    # Rows x longest past one pass (4 x 16 = 64) with more padding than the steps saved
    # pay for (66 - 36 = 30 > 2 x 5): alone in parts.
    assert not service._fits(rows((33, 5), (3, 5)))
    assert service._fits(rows((65, 5)))


def test_a_batch_past_a_few_parts_forms_where_its_padding_costs_less_than_it_saves() -> None:
    service = _service(context=4096, engine_process=True)  # 4 x 64 tokens; passes of 2,048

    def rows(*shapes: tuple[int, int]) -> list[Sequence]:
        return [Sequence([5] * length, max_new, key=KEY) for length, max_new in shapes]

    assert service._fits(rows((500, 128), (490, 128)))  # 10 padded tokens for 128 steps
    assert service._fits(rows((500, 128), (400, 128), (450, 128), (480, 128)))
    assert not service._fits(rows((500, 128), (134, 128)))  # 366 > 2 x 128
    assert not service._fits(rows((500, 128), (490, 4)))  # 4 steps saved pay for 8
    assert not service._fits(rows((1100, 128), (1000, 128)))  # 2,200 > 2,048
    no_big_pass = _service(context=4096, engine_process=True, batch_prefill_tokens=0)
    assert not no_big_pass._fits(rows((500, 128), (490, 128)))
    assert no_big_pass._fits(rows((100, 128), (30, 128)))  # within 4 parts: always
    # og in this process: the pass would hold its GIL, so batches stay within 4 parts.
    in_process = _service(context=4096)
    assert not in_process._fits(rows((500, 128), (490, 128)))
    assert in_process._fits(rows((100, 128), (30, 128)))

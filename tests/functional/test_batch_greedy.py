"""Greedy decoding and batching on the 135M shape (random weights, SmolLM2-135M's shape).

The tiny model hides what this shape shows: its 30 random layers have near-ties in the
logits, so any rounding difference flips a greedy token. A batch's decode step
multiplies M > 1 rows at once, and on some CPUs onnxruntime's int4 MatMulNBits kernel
rounds those differently from a lone request's M = 1 row, so an unseeded greedy request
may decode differently in a batch than alone (machine-dependent: not asserted here). What
is asserted holds on every CPU: a seeded request runs alone and so equals its solo output,
and a prompt ending with the pad id, which og masks in a batch, never shares one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ortserve.core.batcher import Sequence
from ortserve.core.generation import Finish, GenerationRequest, SamplingOptions, Token
from ortserve.core.service import BatchKey, Service, run_batch
from ortserve.core.settings import EngineSettings
from tests import models
from tests.functional.batching import concurrently

pytestmark = pytest.mark.slow

PROMPTS = ["Hello there", "The quick brown fox jumps over the lazy dog", "Edge", "Cold boards"]


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    """The 135M shape with batching on: 4 to a batch, room for a blocker beside one; a
    wide window, so that requests from threads on a busy machine still meet."""
    folder = models.shape_135m()
    settings = EngineSettings(
        model_dir=folder, providers="cpu", max_batch=4, max_concurrency=2, batch_window_ms=200
    )
    yield Service.load(settings)


def _concurrently(service: Service, requests: list[GenerationRequest]) -> tuple[list[str], int]:
    """Texts of `requests` offered to one batch, and the batches run for them."""
    texts, batches, _ = concurrently(service, requests)
    return texts, batches


def test_seeded_greedy_requests_run_alone_and_equal_their_solo_output(service: Service) -> None:
    seeded = [GenerationRequest(prompt=p, options=SamplingOptions(24, seed=7)) for p in PROMPTS]
    unseeded = [GenerationRequest(prompt=p, options=SamplingOptions(24)) for p in PROMPTS]
    # The rule: a seed (greedy or sampled) runs alone; unseeded greedy requests batch.
    assert not any(service._batchable(r) for r in seeded)
    assert all(service._batchable(r) for r in unseeded)
    alone = [service.generate(r).text for r in seeded]  # one by one
    assert len(set(alone)) == len(alone)  # four different completions, not one echoed
    texts, batches = _concurrently(service, seeded)
    assert (texts, batches) == (alone, 0)  # none reached the batcher
    _, batches = _concurrently(service, unseeded)
    assert batches == 1  # the same prompts without a seed share one batch


def test_a_prompt_ending_with_the_pad_id_never_shares_a_batch(service: Service) -> None:
    # "<|endoftext|>" is this model's pad id: og would mask it as padding in a batch, and
    # the request would decode as if its prompt ended one token earlier.
    requests = [
        GenerationRequest(prompt=p, options=SamplingOptions(16))
        for p in ("Edge boards<|endoftext|>", "The quick brown fox")
    ]
    engine = service.engine
    assert engine.encode(requests[0].prompt or "")[-1] == engine.pad_id
    alone = [service.generate(r).text for r in requests]
    texts, batches = _concurrently(service, requests)
    assert (texts, batches) == (alone, 2)  # offered one batch, each ran by itself


def test_without_the_pad_rule_the_padded_prompt_would_decode_differently(
    service: Service,
) -> None:
    # Why the rule exists (og 0.18): batched anyway, the prompt ending with the pad id goes
    # astray, because og masks a batch row's trailing pad ids, its own one included: the
    # pruned lm_head (bake.upstream) then reads the row's last unmasked position, the token
    # before that pad id, from the first token on (og's own unpruned pick got the first
    # token right and went astray after). If this starts to fail, og no longer masks a
    # prompt's own trailing pad id, and `Service._fits` may drop the rule.
    engine = service.engine
    pad_prompt = [*engine.encode("Edge boards"), engine.pad_id]
    options = SamplingOptions(16)
    solo = list(engine.stream_tokens(pad_prompt, options))
    key = BatchKey(engine.sampling(options))
    sequences = [
        Sequence(ids, 16, key=key) for ids in (pad_prompt, engine.encode("The quick brown fox"))
    ]
    assert not service._fits(sequences)
    run_batch(engine, sequences)  # what the batch would give, had `_fits` allowed it
    batched: list[int] = []
    while not isinstance(item := sequences[0].out.get(), Finish):
        assert isinstance(item, Token)
        batched.append(item.id)
    assert batched != solo

"""Picking a sequence's tokens in our code (core.picker, issue 54): the distribution og
0.18 samples from (top-k, top-p, temperature), its repetition penalty, and seeds. The
comparison with og's own sampling on the same logits is in
tests/functional/test_picker_og.py."""

from __future__ import annotations

import numpy as np
import pytest

from ortserve.core.generation import EffectiveSampling
from ortserve.core.picker import Picker, distribution


def _logits(
    vocab: int, seed: int, scale: float = 3.0
) -> np.ndarray[tuple[int], np.dtype[np.float32]]:
    return (np.random.default_rng(seed).normal(size=vocab) * scale).astype(np.float32)


def _reference(
    logits: np.ndarray[tuple[int], np.dtype[np.float32]], top_k: int, top_p: float, temp: float
) -> dict[int, float]:
    """The same distribution the slow, plain way: sort everything, in float64."""
    order = np.argsort(-logits.astype(np.float64), kind="stable")
    scaled = logits.astype(np.float64) / temp
    weights = np.exp(scaled - scaled.max())
    if top_k >= 1:
        order = order[:top_k]
        probs = weights[order] / weights[order].sum()
    else:
        probs = weights[order] / weights.sum()
    if 0 < top_p < 1:
        keep = int(np.flatnonzero(np.cumsum(probs) >= top_p)[0]) + 1
        order, probs = order[:keep], probs[:keep]
    return dict(zip(order.tolist(), (probs / probs.sum()).tolist(), strict=True))


@pytest.mark.parametrize("vocab", [512, 49_152, 151_936])
@pytest.mark.parametrize(
    ("top_k", "top_p"), [(20, 0.8), (50, 1.0), (0, 0.9), (0, 1.0), (1, 0.5), (2000, 0.95)]
)
def test_the_distribution_is_og_s_top_k_then_top_p(vocab: int, top_k: int, top_p: float) -> None:
    for scale in (3.0, 0.3):  # peaked, and flat (the nucleus is most of the vocabulary)
        logits = _logits(vocab, vocab + top_k, scale)
        indices, probs = distribution(logits.copy(), top_k, top_p, 0.7)
        expected = _reference(logits, top_k, top_p, 0.7)
        got = dict(zip(indices.tolist(), probs.tolist(), strict=True))
        # float32 sums (og's) may put the top-p cut one token off float64's on a flat
        # distribution; that token is as unlikely as any
        differ = set(got) ^ set(expected)
        assert len(differ) <= 1 and all(got.get(i, expected.get(i, 0)) < 1e-3 for i in differ)
        assert max(abs(got.get(i, 0) - p) for i, p in expected.items()) < 1e-4
        assert abs(probs.sum() - 1) < 1e-9


def test_greedy_with_a_penalty_sees_the_whole_sequence_as_og_does() -> None:
    """og's penalty (HF's): a logit of a token already in the sequence, prompt included,
    is divided by the penalty when positive and multiplied when negative."""
    logits = np.zeros(16, dtype=np.float32)
    logits[3], logits[5] = 5.0, 4.5  # 3 is in the prompt: 5.0 / 1.3 < 4.5
    picker = Picker(EffectiveSampling(0.0, 1.0, 0, 1.3), None, [3, 3, 9])
    assert picker.pick(logits.copy()) == 5
    assert Picker(EffectiveSampling(0.0, 1.0, 0, 1.0), None, [3]).pick(logits.copy()) == 3
    negative = np.full(16, -4.0, dtype=np.float32)
    negative[7], negative[8] = -1.0, -1.2  # 7 seen: -1.3 < -1.2
    assert Picker(EffectiveSampling(0.0, 1.0, 0, 1.3), None, [7]).pick(negative.copy()) == 8
    # Tokens that join later count too (`saw`), and a tie goes to the first, as og's argmax.
    picker = Picker(EffectiveSampling(0.0, 1.0, 0, 1.3), None, [])
    picker.saw([5])
    assert picker.pick(logits.copy()) == 3
    assert Picker(EffectiveSampling(0.0, 1.0, 0, 1.0), None, []).pick(np.ones(4, np.float32)) == 0


def test_a_seed_gives_the_same_tokens_and_another_seed_others() -> None:
    sampling = EffectiveSampling(1.0, 1.0, 0, 1.0)
    logits = _logits(4096, 1, scale=0.5)

    def run(seed: int | None) -> list[int]:
        picker = Picker(sampling, seed, [])
        return [picker.pick(logits.copy()) for _ in range(30)]

    assert run(7) == run(7)
    assert run(7) != run(8)
    assert run(None) != run(None)
    assert run(-3) == run(-3)  # any int64 seed is taken, negative too


def test_sampled_picks_follow_the_distribution() -> None:
    logits = _logits(64, 2, scale=1.0)
    picker = Picker(EffectiveSampling(0.8, 0.9, 10, 1.0), 11, [])
    draws = np.bincount([picker.pick(logits.copy()) for _ in range(20_000)], minlength=64)
    indices, probs = distribution(logits.copy(), 10, 0.9, 0.8)
    assert set(np.flatnonzero(draws).tolist()) <= set(indices.tolist())
    observed = draws[indices] / draws.sum()
    assert np.abs(observed - probs).max() < 0.02


def test_forcing_makes_one_token_the_greatest() -> None:
    picker = Picker(EffectiveSampling(0.0, 1.0, 0, 1.0), None, [])
    forced = picker.forcing(6, 10)
    assert int(np.argmax(forced)) == 6 and np.count_nonzero(forced == forced.max()) == 1
    assert int(np.argmax(picker.forcing(2, 10))) == 2  # the buffer is reset each time


def test_a_temperature_too_small_for_float32_is_greedy_not_nan() -> None:
    """1 / 1e-45 overflows float32: the scaled logits were NaN and the pick raised."""
    logits = _logits(1000, 3)
    for temperature in (1e-45, 1e-300):
        for top_k, top_p in ((20, 0.8), (0, 0.9), (0, 1.0)):
            picker = Picker(EffectiveSampling(temperature, top_p, top_k, 1.0), 1, [])
            assert picker.pick(logits.copy()) == int(np.argmax(logits))


def test_a_penalty_near_zero_keeps_the_logits_finite() -> None:
    """The API takes any penalty above 0: 5e-324 is 0 in float32, and dividing by it made
    infinities (and 0 / 0 a NaN), so a sampled pick raised "Probabilities contain NaN"
    (the fuzz test's 500). The seen tokens' scores now stay at their limits."""
    logits = _logits(1000, 5)
    logits[3] = 0.0
    for temperature in (0.0, 1.0):
        for penalty in (5e-324, 1e-40):
            picker = Picker(EffectiveSampling(temperature, 1.0, 0, penalty), 1, [3, 7, 11])
            token = picker.pick(logits.copy())
            assert 0 <= token < 1000
    # At a penalty that small, a seen token with a positive logit is the greedy pick.
    seen = int(np.flatnonzero(logits > 0)[0])
    greedy = Picker(EffectiveSampling(0.0, 1.0, 0, 5e-324), 1, [seen])
    assert greedy.pick(logits.copy()) == seen

"""Our token picking (core.picker) against og 0.18's own search on the same logits and
the same sequences (issue 54): a kept generator is neutral and the request picks its
tokens itself, so that a sampled or seeded request can reuse the prompt cache. Greedy
with a repetition penalty must give og's tokens one for one; sampling og's distribution.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og

from ortserve.core.engine import neutral
from ortserve.core.generation import EffectiveSampling
from ortserve.core.og_local import LocalGenerator
from ortserve.core.picker import distribution

PROMPT = [1, 15, 27, 27, 27, 40, 99, 15]


def _decode(steps: LocalGenerator, prompt: list[int], count: int) -> list[int]:
    steps.append(prompt)
    tokens = []
    for _ in range(count):
        token, _, _ = steps.step(None)
        if token < 0:
            break
        tokens.append(token)
    return tokens


def test_greedy_with_a_penalty_picks_og_s_tokens(tiny_model_dir: Path) -> None:
    """60 tokens of a random-weight model (it repeats itself: the penalty decides most
    steps), og's penalty in its search against ours on a neutral generator."""
    model = og.Model(str(tiny_model_dir))
    for penalty in (1.3, 0.8):
        sampling = EffectiveSampling(0.0, 1.0, 0, penalty)
        theirs = LocalGenerator(model, {"max_length": 80, **sampling.search()}, None)
        ours = LocalGenerator(model, {"max_length": 80, **neutral(None).search()}, None)
        ours.pick(sampling, None)
        plain = LocalGenerator(model, {"max_length": 80, **neutral(None).search()}, None)
        expected = _decode(theirs, PROMPT, 60)
        assert _decode(ours, PROMPT, 60) == expected
        assert _decode(plain, PROMPT, 60) != expected  # the penalty mattered


def test_sampling_draws_from_og_s_distribution(tiny_model_dir: Path) -> None:
    """og's sampling and ours on the same logits, 4,000 draws each: the same tokens, and
    frequencies within sampling noise of the distribution `core.picker` computes."""
    model = og.Model(str(tiny_model_dir))
    sampling = EffectiveSampling(0.7, 0.8, 20, 1.0)
    search: dict[str, Any] = {"max_length": 16, "random_seed": 3, **sampling.search()}
    params = og.GeneratorParams(model)
    params.set_search_options(**search)
    generator = og.Generator(model, params)
    generator.append_tokens(PROMPT)
    vocab = np.asarray(generator.get_logits()).reshape(-1).shape[0]
    logits = (np.random.default_rng(5).normal(size=vocab) * 2).astype(np.float32)
    draws = 4000
    theirs = []
    for _ in range(draws):
        generator.get_logits()  # computed again after a rewind: og sets them only then
        generator.set_logits(logits)
        generator.generate_next_token()
        theirs.append(int(generator.get_next_tokens()[0]))
        generator.rewind_to(len(PROMPT))
    ours_steps = LocalGenerator(model, {"max_length": 16, **neutral(None).search()}, None)
    ours_steps.pick(sampling, 3)
    picker = ours_steps._picker  # the picker the steps would use, on the same logits
    assert picker is not None
    ours = [picker.pick(logits.copy()) for _ in range(draws)]
    indices, probs = distribution(logits.copy(), 20, 0.8, 0.7)
    for drawn in (theirs, ours):
        counts = np.bincount(drawn, minlength=vocab)
        assert set(np.flatnonzero(counts).tolist()) <= set(indices.tolist())
        frequencies = counts[indices] / draws
        # 4 standard deviations of each frequency
        assert np.all(np.abs(frequencies - probs) <= 4 * np.sqrt(probs * (1 - probs) / draws))

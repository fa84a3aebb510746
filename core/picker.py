"""How a lone sequence's next token is picked in our own code rather than og's search:
temperature, top-k, top-p and the repetition penalty, as og 0.18 does them on CPU
(`ComputeSampledCategorical`, `ApplyRepetitionPenaltyToLogits`), from the logits og
computed. The engine then hands og that token (`Picker.forcing`: every other logit at
float32's lowest, og's greedy search takes it).

Why: og fixes a Generator's search options (and seeds its random generator) when it makes
it. A generator kept by the prompt cache (core.prompt_cache) is made with neutral options
(greedy, no penalty), so that any later request may reuse it: greedy, sampled or seeded,
at whatever temperature. The request's own way of picking lives here, with its own random
generator (seeded with its seed), and sees the same tokens og's penalty would: the whole
sequence, prompt included.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ortserve.core.generation import EffectiveSampling

_LOWEST = np.finfo(np.float32).min
_LARGEST = float(np.finfo(np.float32).max)
# The nucleus of top-p is looked for among the largest logits first, this many and then
# four times more each round: a sort of the whole vocabulary (152k on Qwen) costs ~10 ms.
_FIRST_NUCLEUS = 64
_CHUNK = 128  # the vocabulary's chunks whose maxima bound the k-th largest logit


class Picker:
    """One sequence's way of picking its tokens (`sampling`: temperature 0 is greedy),
    with its random generator (`seed`: None draws one from the OS) and the tokens of the
    sequence so far (`sequence`: what the repetition penalty sees)."""

    def __init__(
        self, sampling: EffectiveSampling, seed: int | None, sequence: Iterable[int]
    ) -> None:
        self.sampling = sampling
        self._rng = np.random.default_rng(None if seed is None else seed % 2**64)
        self._pending = [int(t) for t in sequence]  # marked in `_seen` at the first pick
        self._seen: np.ndarray[tuple[int], np.dtype[np.bool_]] | None = None
        self._forced: np.ndarray[tuple[int], np.dtype[np.float32]] | None = None
        self._last = 0  # the token `_forced` holds up

    def saw(self, tokens: Iterable[int]) -> None:
        """Tokens that joined the sequence (a prompt's part, a picked token)."""
        if self._seen is None:
            self._pending.extend(int(t) for t in tokens)
        else:
            self._seen[np.fromiter(tokens, dtype=np.int64)] = True

    def pick(self, logits: np.ndarray[tuple[int], np.dtype[np.float32]]) -> int:
        """The next token from one position's `logits` (a copy: they are changed)."""
        vocab = logits.shape[0]
        if self._seen is None:
            self._seen = np.zeros(vocab, dtype=np.bool_)
            self._seen[np.asarray(self._pending, dtype=np.int64)] = True
            self._pending = []
        sampling = self.sampling
        penalty = np.float32(sampling.repetition_penalty)
        if penalty != 1:
            seen = np.flatnonzero(self._seen)
            scores = logits[seen]
            # A penalty near 0 (the API allows any above 0; 5e-324 is 0 in float32) makes
            # infinities, and 0 / 0 a NaN: the scores stay finite, each at its limit.
            with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
                penalized = np.where(scores < 0, scores * penalty, scores / penalty)
            logits[seen] = np.nan_to_num(penalized, nan=0.0, posinf=_LARGEST, neginf=float(_LOWEST))
        if sampling.temperature == 0:
            return int(np.argmax(logits))  # the first of equal maxima, as og's greedy search
        indices, probs = distribution(logits, sampling.top_k, sampling.top_p, sampling.temperature)
        return int(indices[self._rng.choice(len(indices), p=probs)])

    def forcing(self, token: int, vocab: int) -> np.ndarray[tuple[int], np.dtype[np.float32]]:
        """Logits that make og's greedy search take `token` (one buffer, reused)."""
        if self._forced is None or self._forced.shape[0] != vocab:
            self._forced = np.full(vocab, _LOWEST, dtype=np.float32)
        else:
            self._forced[self._last] = _LOWEST
        self._forced[token] = 0.0
        self._last = token
        return self._forced


def distribution(
    logits: np.ndarray[tuple[int], np.dtype[np.float32]],
    top_k: int,
    top_p: float,
    temperature: float,
) -> tuple[np.ndarray[tuple[int], np.dtype[np.intp]], np.ndarray[tuple[int], np.dtype[np.float64]]]:
    """The tokens a sampled pick chooses among, largest logit first, and their
    probabilities, as og 0.18 samples: the `top_k` largest (when 1 or more: 1 is greedy,
    as og 0.18 and transformers take it), softmax at `temperature`, then the smallest
    prefix whose probabilities reach `top_p` (when in (0, 1)), renormalised."""
    if 1.0 / temperature > _LARGEST:  # too small a temperature for float32: all on the top
        return np.array([int(np.argmax(logits))]), np.ones(1)
    inv_temp = np.float32(1.0 / temperature)
    nucleus = 0.0 < top_p < 1.0
    if top_k >= 1:
        indices = _largest(logits, min(top_k, logits.shape[0]))
        probs = _softmax(logits[indices], logits[indices[0]], inv_temp)
    else:
        peak = logits.max()
        every = np.exp((logits - peak) * inv_temp, dtype=np.float32)
        total = every.sum(dtype=np.float32)
        k = _FIRST_NUCLEUS if nucleus else logits.shape[0]
        while True:  # a larger k each round, until it holds the nucleus (or is everything)
            k = min(k, logits.shape[0])
            if _few_chunks(logits.shape[0], k):
                k = logits.shape[0]  # one whole sort rather than several
            indices = _largest(logits, k)
            weights = every[indices]
            if k == logits.shape[0] or weights.sum() / total >= top_p:
                break
            k *= 4
        probs = weights / total
    if nucleus:
        reached = np.flatnonzero(np.cumsum(probs, dtype=np.float32) >= np.float32(top_p))
        keep = int(reached[0]) + 1 if reached.size else len(probs)
        indices, probs = indices[:keep], probs[:keep]
    weights64 = probs.astype(np.float64)
    return indices, weights64 / weights64.sum()


def _softmax(
    scores: np.ndarray[tuple[int], np.dtype[np.float32]], peak: np.float32, inv_temp: np.float32
) -> np.ndarray[tuple[int], np.dtype[np.float32]]:
    weights = np.exp((scores - peak) * inv_temp, dtype=np.float32)
    result: np.ndarray[tuple[int], np.dtype[np.float32]] = weights / weights.sum(dtype=np.float32)
    return result


def _few_chunks(vocab: int, k: int) -> bool:
    """Whether the chunk maxima are too few to bound the k-th largest logit usefully."""
    return k * 8 > -(-vocab // _CHUNK)


def _largest(
    logits: np.ndarray[tuple[int], np.dtype[np.float32]], k: int
) -> np.ndarray[tuple[int], np.dtype[np.intp]]:
    """The indices of the `k` largest logits, largest first. The k-th largest chunk
    maximum bounds the k-th largest logit from below (k chunks hold a logit at least that
    large), so only the logits at or above it are sorted: a few hundred of 152k."""
    vocab = logits.shape[0]
    if _few_chunks(vocab, k):  # the bound would leave most of them: sort them all
        order = np.argsort(-logits)
        result: np.ndarray[tuple[int], np.dtype[np.intp]] = order[:k]
        return result
    padded = -(-vocab // _CHUNK) * _CHUNK
    chunks = np.full(padded, _LOWEST, dtype=np.float32)
    chunks[:vocab] = logits
    maxima = chunks.reshape(-1, _CHUNK).max(axis=1)
    bound = np.partition(maxima, maxima.shape[0] - k)[maxima.shape[0] - k]
    candidates = np.flatnonzero(logits >= bound)
    order = np.argsort(-logits[candidates], kind="stable")[:k]
    return candidates[order]

"""How a prompt goes into the model: in parts (chunked prefill).

onnxruntime-genai keeps Python's GIL through a whole `append_tokens`, and computes the
logits of every position it is given: a prompt appended at once freezes every other
thread of the process (health checks, other streams, signal handling) for the whole
prefill and holds prompt x vocabulary x 4 bytes of logits. Appended in parts, the
process runs between them and holds one part's logits. For one sequence the result is
the same bit for bit (checked on the 135M shape, int4: logits and greedy tokens).
"""

from __future__ import annotations

# A part of one token goes through the decode step's kernel (M = 1), whose int4 rounding
# differs from a prefill's (M > 1): the output could change. No part is that short
# unless the whole prompt is.
_MIN_PART = 2
_MIN_CHUNK = 4  # (a chunk of 2 could not split 3 tokens without a part of one)
# A generator keeps its last part's logits until its next step: one that is kept (the
# prompt cache) ends a longer prompt on a small part, so it holds at most this many
# positions of logits besides its KV cache (core.engine, and core.sizing's cache term).
KEPT_LOGITS_TOKENS = 64


def prefill_parts(total: int, chunk: int, tail: int = 0) -> list[int]:
    """The sizes of the parts a prompt of `total` tokens goes in as (they sum to `total`).

    Each is at most `chunk` tokens and none is a single token (unless `total` is 1).
    With `tail`, the last part is exactly `tail` tokens where the prompt is long enough:
    a generator keeps the logits of its last part, so a generator that is kept (the
    prompt cache) should keep few.

    Raises:
        ValueError: `chunk` is below 4 tokens.
    """
    if chunk < _MIN_CHUNK:
        raise ValueError(f"a prefill chunk holds at least {_MIN_CHUNK} tokens, not {chunk}")
    tail = max(tail, _MIN_PART) if tail else 0
    if tail and total - tail >= _MIN_PART and tail <= chunk:
        return [*prefill_parts(total - tail, chunk), tail]
    parts: list[int] = []
    left = total
    while left > 0:
        size = min(chunk, left)
        if left - size == 1:  # never leave a single token for last
            size -= 1
        parts.append(size)
        left -= size
    return parts

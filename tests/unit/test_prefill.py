"""The parts a prompt's prefill goes in as (core.prefill)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ortserve.core.prefill import prefill_parts


def test_a_long_prompt_goes_in_parts_of_the_chunk() -> None:
    assert prefill_parts(1000, 256) == [256, 256, 256, 232]
    assert prefill_parts(256, 256) == [256]
    assert prefill_parts(100, 256) == [100]


def test_no_part_is_a_single_token() -> None:
    assert prefill_parts(257, 256) == [255, 2]
    assert prefill_parts(1, 256) == [1]


def test_a_kept_generator_ends_on_a_small_part() -> None:
    assert prefill_parts(1000, 256, tail=2) == [256, 256, 256, 230, 2]
    assert prefill_parts(3, 256, tail=2) == [3]  # the rest would be one token
    assert prefill_parts(2, 256, tail=2) == [2]


def test_a_chunk_below_four_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 4"):
        prefill_parts(10, 2)


@given(st.integers(1, 20000), st.integers(4, 4096), st.sampled_from([0, 2, 8]))
def test_parts_cover_the_prompt_within_the_chunk(total: int, chunk: int, tail: int) -> None:
    parts = prefill_parts(total, chunk, tail)
    assert sum(parts) == total
    assert all(1 <= p <= chunk for p in parts)
    assert total == 1 or all(p >= 2 for p in parts)
    if tail and total - tail >= 2 and tail <= chunk:
        assert parts[-1] == tail

"""The service feeds a batch's sequences from the engine's steps (core.service.run_batch),
with a stand-in engine (#28 items 3, 7)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, cast

from ortserve.core.batcher import Sequence
from ortserve.core.generation import EffectiveSampling, Finish, Token
from ortserve.core.service import BatchKey, run_batch

GREEDY = EffectiveSampling(0.0, 1.0, 0, 1.0)
EOS = 0


class _Engine:
    """Yields `steps` (one token per row each) and records how far it was read."""

    eos_ids = frozenset({EOS})

    def __init__(self, steps: list[list[int]]) -> None:
        self.steps = steps
        self.asked: tuple[list[list[int]], int, EffectiveSampling] | None = None
        self.read = 0
        self.closed = False
        self.to_limit = False

    def decode_batch(
        self,
        prompts: list[list[int]],
        max_new: int,
        sampling: EffectiveSampling,
        tenants: list[str] | None = None,
        to_limit: bool = False,
    ) -> Generator[list[int], None, None]:
        self.asked = (prompts, max_new, sampling)
        self.to_limit = to_limit
        try:
            for step in self.steps:
                self.read += 1
                yield step
        finally:
            self.closed = True


def _fed(sequence: Sequence) -> list[int | str]:
    items: list[int | str] = []
    while not sequence.out.empty():
        item = sequence.out.get()
        assert isinstance(item, (Token, Finish))
        items.append(item.reason if isinstance(item, Finish) else item.id)
    return items


def test_each_row_is_fed_until_its_eos_or_its_own_limit() -> None:
    engine = _Engine([[5, 7], [EOS, 8], [9, 9], [9, 9]])
    ends_early, limited = (
        Sequence([1, 2], 10, key=BatchKey(GREEDY)),
        Sequence([3], 2, key=BatchKey(GREEDY)),
    )
    run_batch(cast(Any, engine), [ends_early, limited])
    assert _fed(ends_early) == [5, "eos"]
    assert _fed(limited) == [7, 8, "length"]
    assert engine.asked == ([[1, 2], [3]], 10, GREEDY)  # the longest limit sizes the batch
    assert engine.read == 2 and engine.closed  # no step more than the rows needed


def test_a_row_whose_client_left_is_fed_no_more() -> None:
    engine = _Engine([[5, 7], [6, 8], [EOS, EOS]])
    gone, stays = Sequence([1], 5, key=BatchKey(GREEDY)), Sequence([2], 5, key=BatchKey(GREEDY))
    gone.leave()
    run_batch(cast(Any, engine), [gone, stays])
    assert _fed(gone) == []
    assert _fed(stays) == [7, 8, "eos"]


def test_rows_still_fed_when_the_steps_run_out_end_with_length() -> None:
    # The batch's max_length (the context) came before their own limits.
    engine = _Engine([[5, 6]])
    rows = [Sequence([1], 5, key=BatchKey(GREEDY)), Sequence([2], 5, key=BatchKey(GREEDY))]
    run_batch(cast(Any, engine), rows)
    assert [_fed(r) for r in rows] == [[5, "length"], [6, "length"]]
    assert engine.closed


def test_a_batch_of_rows_forced_to_their_limits_asks_og_to_hold_eos_back() -> None:
    # ignore_eos: the key says so, and the engine is asked for it (og's min_length is the
    # whole batch's); each row is still cut at its own limit.
    engine = _Engine([[5, 7], [6, 8], [9, 9]])
    key = BatchKey(GREEDY, to_limit=True)
    rows = [Sequence([1], 3, key=key), Sequence([2], 1, key=key)]
    run_batch(cast(Any, engine), rows)
    assert engine.to_limit
    assert [_fed(r) for r in rows] == [[5, 6, 9, "length"], [7, "length"]]

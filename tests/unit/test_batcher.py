"""The batcher's scheduling, with a stand-in for the engine's batch runner."""

from __future__ import annotations

import time

from ortserve.core.batcher import Alone, Batcher, Sequence
from ortserve.core.generation import Finish

WINDOW_S = 30.0  # far longer than any wait below: a test that waited it would time out


def _seq(key: int = 0) -> Sequence:
    return Sequence(input_ids=[1, 2], max_new=1, key=key)


class Runner:
    """Records the batches it runs; ends each sequence at once."""

    def __init__(self) -> None:
        self.batches: list[list[Sequence]] = []

    def __call__(self, batch: list[Sequence]) -> None:
        self.batches.append(batch)
        for sequence in batch:
            sequence.out.put(Finish("length"))


def _alone(sequence: Sequence) -> None:
    """What a request does when told to run alone: run, then say it is done."""
    assert isinstance(sequence.out.get(timeout=10), Alone)
    sequence.done.set()


def test_a_lone_sequence_starts_at_once_and_runs_in_its_own_thread() -> None:
    runner = Runner()
    batcher = Batcher(runner, max_batch=4, window_s=WINDOW_S)
    start = time.monotonic()
    lone = _seq()
    batcher.submit(lone)
    _alone(lone)  # handed back within the get timeout, not after the 30 s window
    assert time.monotonic() - start < 10
    assert runner.batches == [] and batcher.batches_run == 1


def test_a_request_that_queued_behind_a_lone_one_waits_the_window_for_company() -> None:
    # Two closed-loop clients would otherwise take turns running alone for ever.
    runner = Runner()
    batcher = Batcher(runner, max_batch=2, window_s=WINDOW_S)
    a = _seq()
    batcher.submit(a)
    assert isinstance(a.out.get(timeout=10), Alone)
    a.paused_at = None  # a is computing
    c = _seq()
    batcher.submit(c)  # while a runs: requests come concurrently
    a.done.set()
    time.sleep(0.2)  # c is taken and waits (the window is 30 s, not 1 ms) ...
    d = _seq()
    batcher.submit(d)  # ... for d, which fills the batch at once
    assert isinstance(c.out.get(timeout=10), Finish)  # not `Alone`
    assert isinstance(d.out.get(timeout=10), Finish)
    assert runner.batches == [[c, d]]


def test_only_equal_keys_share_a_batch_and_a_stalled_lone_reader_holds_up_nobody() -> None:
    runner = Runner()
    batcher = Batcher(runner, max_batch=4, window_s=0.05)
    lone = _seq(key=1)
    batcher.submit(lone)
    assert isinstance(lone.out.get(timeout=10), Alone)
    lone.paused_at = time.monotonic()  # its reader stopped reading; done is never set
    x, y = _seq(key=2), _seq(key=3)
    batcher.submit(x)
    batcher.submit(y)
    assert isinstance(x.out.get(timeout=10), Alone)  # different keys: each alone
    x.done.set()
    assert isinstance(y.out.get(timeout=10), Alone)
    y.done.set()
    assert runner.batches == []


def test_a_batch_takes_the_companion_closest_in_length_to_its_longest_prompt() -> None:
    # Prompts are padded to the longest: of the waiting ones that fit, the closest first.
    runner = Runner()
    batcher = Batcher(runner, max_batch=2, window_s=WINDOW_S)
    blocker = _seq()
    batcher.submit(blocker)
    assert isinstance(blocker.out.get(timeout=10), Alone)
    blocker.paused_at = None  # computing: the next ones queue behind it
    first, far, near = (Sequence([1] * n, 1, key=0) for n in (500, 130, 480))
    for sequence in (first, far, near):
        batcher.submit(sequence)
    blocker.done.set()
    assert isinstance(first.out.get(timeout=10), Finish)
    assert isinstance(near.out.get(timeout=10), Finish)
    assert runner.batches == [[first, near]]  # `far` waits for the next one
    far.leave()

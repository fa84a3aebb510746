"""Micro-batching: requests that arrive close together decode as one batch.

On a CPU, decode is memory-bandwidth bound: a step for 4 sequences costs little more than
a step for 1, so batching concurrent requests multiplies throughput. A batch starts
together and cannot take a sequence later (an onnxruntime-genai Generator's batch is
fixed), so a request that arrives while a batch runs waits for the next one.

This module holds the scheduling only; the service supplies `run_batch`, which decodes a
batch and feeds each sequence's queue the steps a lone decoding yields (core.generation).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from ortserve.core.generation import DecodeEvent

# How long a request that looks alone waits for company before it starts.
LONE_WAIT_S = 0.001
# A lone generation whose reader has not asked for its next token for this long is
# stalled: the next batch need not wait for it.
STALLED_AFTER_S = 0.05
STALL_CHECK_S = 0.01
# The batcher's thread ends after this long without work (the next request starts a new
# one): a running thread holds the engine, so a service swapped out by a model reload
# could otherwise never be freed.
IDLE_EXIT_S = 2.0


@dataclass(frozen=True)
class Alone:
    """A batch of one: its request runs the generation in its own thread and sets
    `Sequence.done` when it ends. Handing every token over from the batcher's thread
    costs a lone request ~4% of its latency here (onnxruntime-genai keeps the GIL
    through a step, and each hand-over wakes one more thread on a busy CPU)."""


@dataclass
class Sequence:
    """One request's place in a batch.

    Attributes:
        input_ids: The prompt's tokens.
        max_new: Its token limit.
        key: Requests batch together only when their keys are equal (sampling options).
        out: Its steps (a `Token` each, then a `Finish`) or the exception that stopped
            the batch; or `Alone`, when the request is to run its generation itself.
        cancelled: Set by the request when its client is gone; the batch stops feeding it.
        done: Set by the request when a generation it runs `Alone` has ended (or will
            never start).
        paused_at: When the request last handed a token to its reader and is waiting for
            it to ask for the next (None while it computes).
        queued_behind: It arrived while a batch ran (so requests come concurrently).
        tenant: Whose request it is (core.tenants): its fault record is its tenant's.
    """

    input_ids: list[int]
    max_new: int
    key: Hashable
    out: queue.SimpleQueue[DecodeEvent | Alone | BaseException] = field(
        default_factory=queue.SimpleQueue
    )
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    paused_at: float | None = field(default_factory=time.monotonic)
    queued_behind: bool = False
    tenant: str = ""

    def pause(self, paused: bool) -> None:
        """Say whether the request is waiting for its reader (or prefilling in parts):
        the engine's `paused` callback, for a sequence that runs alone."""
        self.paused_at = time.monotonic() if paused else None

    def leave(self) -> None:
        """The request is done with it: a batch feeds it no more, and it will not run
        alone (idempotent)."""
        self.cancelled.set()
        self.done.set()


class Batcher:
    """Collects sequences for up to `window_s` after the first, then runs them as a batch.

    The whole window is waited only when requests come concurrently: the last batch had
    more than one sequence, the first request arrived while a batch ran, others are
    already waiting, `arriving()` counts requests on their way in (being tokenized), or a
    companion joins. Otherwise the first request waits `LONE_WAIT_S` for one and then
    starts (as `Alone`): a single client pays about a millisecond, and requests that
    reach the engine within it after a quiet spell still batch.

    Attributes:
        batches_run: Batches decoded so far.
        sequences_run: Sequences in them (÷ batches_run: the mean batch size).
    """

    def __init__(
        self,
        run_batch: Callable[[list[Sequence]], None],
        max_batch: int,
        window_s: float,
        arriving: Callable[[], int] = lambda: 0,
        fits: Callable[[list[Sequence]], bool] = lambda batch: True,
    ) -> None:
        """`fits` says whether sequences can share a batch and each still get its whole
        token limit (prompts are padded to the longest, and the context is one length)."""
        self._run_batch = run_batch
        self._fits = fits
        self._arriving = arriving
        self._last_size = 0
        self._running = False  # a batch (or a lone sequence) is running
        self.max_batch = max_batch
        self.window_s = window_s
        self._pending: deque[Sequence] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.batches_run = 0
        self.sequences_run = 0

    def submit(self, sequence: Sequence) -> None:
        """Queue a sequence; its tokens arrive on `sequence.out`."""
        with self._cond:
            sequence.queued_behind = self._running
            self._pending.append(sequence)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="batcher", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _take(self) -> list[Sequence] | None:
        """The next batch; None when nothing came for IDLE_EXIT_S (the thread is then
        forgotten, under the lock, so the next `submit` starts a new one)."""
        with self._cond:
            if not self._pending:
                self._cond.wait_for(lambda: bool(self._pending), IDLE_EXIT_S)
                if not self._pending:
                    self._thread = None
                    return None
            first = self._pending.popleft()
            batch = [first]
            start = time.monotonic()
            concurrent = (
                self._last_size > 1
                or first.queued_behind
                or bool(self._pending)
                or self._arriving() > 0
            )
            deadline = start + (self.window_s if concurrent else min(self.window_s, LONE_WAIT_S))
            while len(batch) < self.max_batch:
                # Of the companions that fit, the one whose prompt is closest in length to
                # the batch's longest: prompts are padded to it.
                longest = max(len(s.input_ids) for s in batch)
                match = min(
                    (s for s in self._pending if s.key == first.key and self._fits([*batch, s])),
                    key=lambda s: abs(len(s.input_ids) - longest),
                    default=None,
                )
                if match is not None:
                    self._pending.remove(match)
                    batch.append(match)
                    deadline = max(deadline, start + self.window_s)  # company: wait it all
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return [s for s in batch if not s.cancelled.is_set()]

    def _run_alone(self, sequence: Sequence) -> None:
        """Let a lone sequence run in its request's thread; wait until it ends, or until
        its reader stops reading while others wait (a paused generation computes
        nothing, so the next batch may run beside it instead of waiting on a reader)."""
        sequence.out.put(Alone())
        while not sequence.done.wait(STALL_CHECK_S):
            paused_at = sequence.paused_at
            if paused_at is not None and time.monotonic() - paused_at > STALLED_AFTER_S:
                with self._cond:
                    if self._pending:
                        return

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            if not batch:
                continue
            self.batches_run += 1
            self.sequences_run += len(batch)
            self._last_size = len(batch)
            self._running = True
            try:
                if len(batch) == 1:
                    self._run_alone(batch[0])
                else:
                    self._run_batch(batch)
            except BaseException as exc:  # every waiting request must hear of it
                for sequence in batch:
                    sequence.out.put(exc)
            finally:
                self._running = False

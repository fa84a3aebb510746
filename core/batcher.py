"""Micro-batching: requests that arrive close together decode as one batch.

On a CPU, decode is memory-bandwidth bound: a step for 4 sequences costs little more than
a step for 1, so batching concurrent requests multiplies throughput. A batch starts
together and cannot take a sequence later (an onnxruntime-genai Generator's batch is
fixed), so a request that arrives while a batch runs waits for the next one.

This module holds the scheduling only; the engine supplies `run_batch`, which decodes a
batch and feeds each sequence's queue.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class End:
    """The end of a sequence: `eos` (the model ended it) or `length` (its token limit)."""

    reason: str


@dataclass
class Sequence:
    """One request's place in a batch.

    Attributes:
        input_ids: The prompt's tokens.
        max_new: Its token limit.
        key: Requests batch together only when their keys are equal (sampling options).
        out: New tokens, then an `End` or the exception that stopped the batch.
        cancelled: Set by the request when its client is gone; the batch stops feeding it.
    """

    input_ids: list[int]
    max_new: int
    key: Hashable
    out: queue.SimpleQueue[int | End | BaseException] = field(default_factory=queue.SimpleQueue)
    cancelled: threading.Event = field(default_factory=threading.Event)


class Batcher:
    """Collects sequences for up to `window_s` after the first, then runs them as a batch.

    Attributes:
        batches_run: Batches decoded so far.
        sequences_run: Sequences in them (÷ batches_run: the mean batch size).
    """

    def __init__(
        self, run_batch: Callable[[list[Sequence]], None], max_batch: int, window_s: float
    ) -> None:
        self._run_batch = run_batch
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
            self._pending.append(sequence)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="batcher", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _take(self) -> list[Sequence]:
        with self._cond:
            while not self._pending:
                self._cond.wait()
            first = self._pending.popleft()
            batch = [first]
            deadline = time.monotonic() + self.window_s
            while len(batch) < self.max_batch:
                match = next((s for s in self._pending if s.key == first.key), None)
                if match is not None:
                    self._pending.remove(match)
                    batch.append(match)
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return [s for s in batch if not s.cancelled.is_set()]

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if not batch:
                continue
            self.batches_run += 1
            self.sequences_run += len(batch)
            try:
                self._run_batch(batch)
            except BaseException as exc:  # every waiting request must hear of it
                for sequence in batch:
                    sequence.out.put(exc)

"""Admission control: at most N generations at once, a bounded queue, never a hang."""

from __future__ import annotations

import math
import threading
import time
from collections import deque

from ortserve.core.errors import BusyError, ClientClosedError

# How often a waiter whose client may leave looks at its cancellation flag: an Event
# cannot wake a Condition, and a queued request whose client left should go at once.
# (The model state's and the service's waiters use it too.)
CANCEL_POLL_S = 0.05


class Admission:
    """A counting gate with a bounded, time-limited wait.

    With request batching, a sequence in a batch takes 1/`batch` of a generation and a
    request that runs alone takes a whole one, so a batch and an unbatched generation
    cost the same.

    Attributes:
        max_active: Generations allowed at once.
        max_queue: Requests allowed to wait; one more is refused at once.
        timeout_s: How long a request may wait before it is refused.
        batch: Sequences per batch (1: no batching).
    """

    def __init__(self, max_active: int, max_queue: int, timeout_s: float, batch: int = 1) -> None:
        self.max_active = max_active
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.batch = batch
        self._capacity = max_active * batch  # in sequences
        self._cond = threading.Condition()
        self._units = 0
        self._active = 0
        self._queue: deque[object] = deque()  # tickets of the waiting requests, in order
        self._mean_s = 1.0  # running mean of slot hold times, for Retry-After

    @property
    def active(self) -> int:
        """Requests being served now."""
        return self._active

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot now."""
        return len(self._queue)

    def retry_after_s(self) -> int:
        """A hint for clients: about when a slot may be free."""
        backlog = (len(self._queue) + 1) / self.max_active
        return max(1, math.ceil(self._mean_s * backlog))

    def acquire(self, batched: bool = False, cancelled: threading.Event | None = None) -> float:
        """Wait for a slot (a batch's place, when `batched`); return the seconds waited.

        Waiters are served first come, first served: a request that needs a whole
        generation is not overtaken by later batched ones. A request whose `cancelled`
        is set (its client left) takes no slot and leaves the queue at once.

        Raises:
            BusyError: The queue is full, or no slot came free within `timeout_s`.
            ClientClosedError: `cancelled` was set before a slot was taken.
        """
        units = self._units_of(batched)
        start = time.monotonic()
        with self._cond:
            _check(cancelled)
            if self._units + units <= self._capacity and not self._queue:
                self._take(units)
                return 0.0
            if len(self._queue) >= self.max_queue:
                raise BusyError("the server is busy: queue full", self.retry_after_s())
            ticket = object()
            self._queue.append(ticket)
            try:
                deadline = start + self.timeout_s
                while self._queue[0] is not ticket or self._units + units > self._capacity:
                    _check(cancelled)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise BusyError(
                            f"the server is busy: no slot within {self.timeout_s:g} s",
                            self.retry_after_s(),
                        )
                    self._cond.wait(left if cancelled is None else min(left, CANCEL_POLL_S))
                _check(cancelled)
                self._take(units)
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()  # the next in line may fit now
        return time.monotonic() - start

    def _units_of(self, batched: bool) -> int:
        return 1 if batched else self.batch

    def _take(self, units: int) -> None:
        self._units += units
        self._active += 1

    def release(self, held_s: float, batched: bool = False) -> None:
        """Free the slot a request held for `held_s` seconds."""
        with self._cond:
            self._units -= self._units_of(batched)
            self._active -= 1
            self._mean_s = 0.8 * self._mean_s + 0.2 * held_s
            self._cond.notify_all()


def _check(cancelled: threading.Event | None) -> None:
    if cancelled is not None and cancelled.is_set():
        raise ClientClosedError("the client closed the request before a slot was free")

"""Admission control: at most N generations at once, a bounded queue, never a hang."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from core.errors import BusyError


class Admission:
    """A counting gate with a bounded, time-limited wait.

    Attributes:
        max_active: Generations allowed at once.
        max_queue: Requests allowed to wait; one more is refused at once.
        timeout_s: How long a request may wait before it is refused.
    """

    def __init__(self, max_active: int, max_queue: int, timeout_s: float) -> None:
        self.max_active = max_active
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._active = 0
        self._waiting = 0
        self._mean_s = 1.0  # running mean of slot hold times, for Retry-After

    @property
    def active(self) -> int:
        """Generations running now."""
        return self._active

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot now."""
        return self._waiting

    def retry_after_s(self) -> int:
        """A hint for clients: about when a slot may be free."""
        backlog = (self._waiting + 1) / self.max_active
        return max(1, math.ceil(self._mean_s * backlog))

    def acquire(self) -> float:
        """Wait for a slot; return the seconds waited.

        Raises:
            BusyError: The queue is full, or no slot came free within `timeout_s`.
        """
        start = time.monotonic()
        with self._cond:
            if self._active < self.max_active and self._waiting == 0:
                self._active += 1
                return 0.0
            if self._waiting >= self.max_queue:
                raise BusyError("the server is busy: queue full", self.retry_after_s())
            self._waiting += 1
            try:
                deadline = start + self.timeout_s
                while self._active >= self.max_active:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise BusyError(
                            f"the server is busy: no slot within {self.timeout_s:g} s",
                            self.retry_after_s(),
                        )
                    self._cond.wait(left)
                self._active += 1
            finally:
                self._waiting -= 1
        return time.monotonic() - start

    def release(self, held_s: float) -> None:
        """Free a slot held for `held_s` seconds."""
        with self._cond:
            self._active -= 1
            self._mean_s = 0.8 * self._mean_s + 0.2 * held_s
            self._cond.notify()

    @contextmanager
    def slot(self) -> Iterator[float]:
        """`with admission.slot() as waited_s:` hold a slot for the block."""
        waited = self.acquire()
        start = time.monotonic()
        try:
            yield waited
        finally:
            self.release(time.monotonic() - start)

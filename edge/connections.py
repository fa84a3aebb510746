"""Connection limits uvicorn lacks: a deadline on reading each request, a connection cap.

uvicorn's only connection timeout is `timeout_keep_alive`, armed after a response and
disarmed by any byte: a connection that never sends a byte, or sends its head one line
a second (slowloris), stays open for ever, and `limit_concurrency` counts requests only
once their head is complete (then answers them a plain-text 503). So the daemon serves
HTTP/1.1 with uvicorn's h11 protocol plus:

- a read deadline: from the moment a connection waits for a request (it opened, or the
  previous response ended), the whole request, head and body, must arrive within
  `read_timeout_s`, or the connection is closed;
- a cap: a connection accepted beyond `max_connections` is closed at once, unread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("ortserve.edge")

# A flood of refused connections logs one line a minute, not one per connection.
_WARN_EVERY_S = 60.0
# Client states in which the request is still being read: its head, or its body.
_READING = (h11.IDLE, h11.SEND_BODY)


class _GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a request read deadline and a connection cap."""

    read_timeout_s: ClassVar[float]
    max_connections: ClassVar[int]
    _last_warning: ClassVar[float] = -_WARN_EVERY_S

    _read_timer: asyncio.TimerHandle | None = None

    def connection_made(  # type: ignore[override]  # uvicorn narrows it the same way
        self, transport: asyncio.Transport
    ) -> None:
        """Count the connection; close it at once past the cap, else start its deadline."""
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self._warn_refused()
            transport.close()  # uvicorn forgets it in `connection_lost`
            return
        self._watch()

    def data_received(self, data: bytes) -> None:
        """Feed h11 (uvicorn), then stop the deadline once the request is all in."""
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        """After a response the connection waits for the next request: a new deadline."""
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the deadline with the connection."""
        self._stop_timer()
        super().connection_lost(exc)

    def _watch(self) -> None:
        """Arm the deadline while a request is being read; disarm it once it is read."""
        reading = self.conn.their_state in _READING and not self.transport.is_closing()
        if reading and self._read_timer is None:
            self._read_timer = self.loop.call_later(self.read_timeout_s, self._timed_out)
        elif not reading:
            self._stop_timer()

    def _stop_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _timed_out(self) -> None:
        self._read_timer = None
        if self.conn.their_state in _READING and not self.transport.is_closing():
            # As uvicorn's keep-alive timeout does; an unfinished request gets no answer.
            self.transport.close()

    @classmethod
    def _warn_refused(cls) -> None:
        now = time.monotonic()
        if now - cls._last_warning >= _WARN_EVERY_S:
            cls._last_warning = now
            log.warning(
                "%d connections open: closing new ones (ORTSERVE_MAX_CONNECTIONS)",
                cls.max_connections,
            )


def guarded_h11(read_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol class (`uvicorn.Config(http=...)`) with these limits."""

    class GuardedH11(_GuardedH11):
        pass

    GuardedH11.read_timeout_s = read_timeout_s
    GuardedH11.max_connections = max_connections
    return GuardedH11

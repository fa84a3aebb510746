"""Connection limits uvicorn lacks: a read deadline, a cap per peer and a global cap.

uvicorn's only connection timeout is `timeout_keep_alive`, armed after a response and
disarmed by any byte: a connection that never sends a byte, or sends its head one line
a second (slowloris), stays open for ever, and `limit_concurrency` counts requests only
once their head is complete (then answers them a plain-text 503). So the daemon serves
HTTP/1.1 with uvicorn's h11 protocol plus:

- a read deadline: from the moment a connection waits for a request (it opened, or the
  previous response ended), the whole request, head and body, must arrive within
  `read_timeout_s`, or the connection is closed;
- a cap per peer: a connection from a peer (an IPv4 address, an IPv6 /64) that already
  has `max_connections_per_peer` open closes, instead of itself, that peer's connection
  waiting longest for its request; it is closed at once, unread, only when every one of
  the peer's connections has its request inside the app. So a peer's idle connections
  cannot keep out its own probes (a monitor or a proxy on the same address) either;
- a global cap that never locks new clients out: a connection accepted beyond
  `max_connections` closes, instead of itself, the connection that has waited longest
  for its request, taken from the peer with the most connections open. Idle connections
  (opened, no bytes sent) held to the cap refused every new one, probes included; now a
  connection is refused only when every open one has its request inside the app, which
  the engine's slots, queue and threads bound. Closing an idle connection is allowed at
  any time (RFC 9112, 9.8), and a new connection sends its request at once, so it is
  never the one waiting longest of a peer that holds the most.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections import Counter
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("ortserve.edge")

# A flood of refused connections logs one line a minute (of each kind), not one each.
_WARN_EVERY_S = 60.0
# Client states in which the request is still being read: its head, or its body.
_READING = (h11.IDLE, h11.SEND_BODY)


def peer_of(host: str | None) -> str:
    """The peer a connection from `host` counts against: an IPv4 address (IPv4-mapped
    IPv6 included) or an IPv6 /64, since one IPv6 host commonly holds a whole /64."""
    if host is None:  # the peer's address could not be read (it already left)
        return ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class _GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a request read deadline and the connection caps.

    Class attributes are one server's (`guarded_h11` makes a subclass per server).
    """

    read_timeout_s: ClassVar[float]
    max_connections: ClassVar[int]
    max_per_peer: ClassVar[int]
    # Open connections, by peer; those reading a request, by peer, longest waiting first.
    _open: ClassVar[Counter[str]]
    _reading: ClassVar[dict[str, dict[_GuardedH11, None]]]
    _last_warning: ClassVar[dict[str, float]]

    _peer: str | None = None  # set while the connection is counted
    _read_timer: asyncio.TimerHandle | None = None

    def connection_made(  # type: ignore[override]  # uvicorn narrows it the same way
        self, transport: asyncio.Transport
    ) -> None:
        """Count the connection and start its deadline; past a cap, close it or an idle one."""
        no_delay(transport)
        super().connection_made(transport)
        peer = peer_of(self.client[0] if self.client else None)
        if self._open[peer] >= self.max_per_peer and not self._close_longest_waiting(peer):
            message = "%s has %d connections open, each with a request: closing new ones (%s)"
            self._warn(
                "peer", message, peer, self.max_per_peer, "ORTSERVE_MAX_CONNECTIONS_PER_PEER"
            )
            transport.close()  # uvicorn forgets it in `connection_lost`
            return
        if self._open.total() >= self.max_connections and not self._close_longest_waiting():
            message = "%d connections open, each with a request in progress: closing new ones (%s)"
            self._warn("busy", message, self.max_connections, "ORTSERVE_MAX_CONNECTIONS")
            transport.close()
            return
        self._peer = peer
        self._open[peer] += 1
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
        """Forget the deadline and the count with the connection."""
        self._forget()
        super().connection_lost(exc)

    @classmethod
    def _close_longest_waiting(cls, peer: str | None = None) -> bool:
        """Close the connection waiting longest for its request, of `peer` or else of the
        peer with the most connections open; False if none is waiting for one."""
        if peer is not None:
            if not cls._reading.get(peer):
                return False
            message = "%s has %d connections open: closing its longest waiting for a request (%s)"
            cls._warn(
                "peer-full", message, peer, cls.max_per_peer, "ORTSERVE_MAX_CONNECTIONS_PER_PEER"
            )
        else:
            waiting = [p for p, connections in cls._reading.items() if connections]
            if not waiting:
                return False
            peer = max(waiting, key=cls._open.__getitem__)
            message = "%d connections open: closing those waiting longest for a request (%s)"
            cls._warn("full", message, cls.max_connections, "ORTSERVE_MAX_CONNECTIONS")
        victim = next(iter(cls._reading[peer]))
        victim._forget()  # counted out now: its `connection_lost` comes a turn later
        victim.transport.close()
        return True

    def _watch(self) -> None:
        """Arm the deadline while a request is being read; disarm it once it is read."""
        if self._peer is None:  # closed by a cap
            return
        reading = self.conn.their_state in _READING and not self.transport.is_closing()
        if reading and self._read_timer is None:
            self._read_timer = self.loop.call_later(self.read_timeout_s, self._timed_out)
            self._reading.setdefault(self._peer, {})[self] = None
        elif not reading:
            self._stop_timer()

    def _stop_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        if self._peer is not None:
            waiting = self._reading.get(self._peer, {})
            waiting.pop(self, None)
            if not waiting:
                self._reading.pop(self._peer, None)

    def _forget(self) -> None:
        """Stop the deadline and count the connection out (once)."""
        self._stop_timer()
        if self._peer is not None:
            self._open[self._peer] -= 1
            if not self._open[self._peer]:
                del self._open[self._peer]
            self._peer = None

    def _timed_out(self) -> None:
        self._read_timer = None  # it fired
        if self.conn.their_state in _READING and not self.transport.is_closing():
            # As uvicorn's keep-alive timeout does; an unfinished request gets no answer.
            self._forget()
            self.transport.close()
        else:
            self._stop_timer()

    @classmethod
    def _warn(cls, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - cls._last_warning.get(kind, -_WARN_EVERY_S) >= _WARN_EVERY_S:
            cls._last_warning[kind] = now
            log.warning(message, *args)


def guarded_h11(
    read_timeout_s: float, max_connections: int, max_per_peer: int
) -> type[H11Protocol]:
    """uvicorn's h11 protocol class (`uvicorn.Config(http=...)`) with these limits."""

    class GuardedH11(_GuardedH11):
        pass

    GuardedH11.read_timeout_s = read_timeout_s
    GuardedH11.max_connections = max_connections
    GuardedH11.max_per_peer = max_per_peer
    GuardedH11._open = Counter()
    GuardedH11._reading = {}
    GuardedH11._last_warning = {}
    return GuardedH11


def no_delay(transport: asyncio.Transport) -> None:
    """Send each write at once (TCP_NODELAY). asyncio sets it only on sockets whose
    `proto` is IPPROTO_TCP, and the daemon's listener (`socket.create_server`) has proto 0:
    without it, a response's body waited for the ACK of its head, which the client delays
    (~40 ms): every request on a kept-alive connection took 44 ms here."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

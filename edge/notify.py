"""sd_notify without libsystemd: datagrams to the socket systemd names in NOTIFY_SOCKET.

The protocol is newline-separated `KEY=VALUE` lines in one datagram (sd_notify(3)).
Outside systemd (no socket) every call is a no-op, so the daemon runs the same anywhere.
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger("ortserve.edge")


def socket_address(name: str) -> str | bytes:
    """The address for `name`: a path, or an abstract-namespace name when it starts with @."""
    if name.startswith("@"):
        return b"\0" + name[1:].encode()
    return name


class Notifier:
    """Sends state changes to systemd (Type=notify) when it listens.

    Attributes:
        enabled: Whether there is a socket to send to.
        watchdog_interval_s: Seconds between watchdog pings (half of WATCHDOG_USEC), or
            None when the watchdog is off or meant for another process.
    """

    def __init__(
        self,
        notify_socket: str | None,
        watchdog_usec: int | None = None,
        watchdog_pid: int | None = None,
    ) -> None:
        """Send to `notify_socket` (None or empty: send nothing)."""
        self._address = socket_address(notify_socket) if notify_socket else None
        self.enabled = self._address is not None
        mine = watchdog_pid is None or watchdog_pid == os.getpid()
        self.watchdog_interval_s = (
            watchdog_usec / 2e6 if self.enabled and watchdog_usec and mine else None
        )

    def send(self, *lines: str) -> bool:
        """Send `lines` (e.g. `READY=1`) in one datagram; True when it was sent.

        A failure is logged, never raised: the service keeps serving without systemd's
        bookkeeping rather than dying over it.
        """
        if self._address is None:
            return False
        message = "\n".join(lines).encode()
        try:
            # Non-blocking: a full socket queue must drop a message, never stall the loop.
            kind = socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
            with socket.socket(socket.AF_UNIX, kind) as sock:
                sock.sendto(message, self._address)
        except OSError as exc:
            log.warning("sd_notify %s failed: %s", lines[0].split("=")[0], exc)
            return False
        return True

    def status(self, text: str) -> bool:
        """A one-line status for `systemctl status`."""
        return self.send(f"STATUS={_one_line(text)}")

    def ready(self, text: str) -> bool:
        """The service is up and serving (sent once the model is loaded and probed)."""
        return self.send("READY=1", f"STATUS={_one_line(text)}")

    def reloading(self, text: str) -> bool:
        """A reload (model switch) starts; `ready` ends it. MONOTONIC_USEC is what systemd
        253+ matches a reload by (Type=notify-reload); older ones ignore it."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={usec}", f"STATUS={_one_line(text)}")

    def stopping(self, text: str) -> bool:
        """The service is shutting down."""
        return self.send("STOPPING=1", f"STATUS={_one_line(text)}")

    def watchdog(self) -> bool:
        """Tell systemd the service is alive (call every `watchdog_interval_s`)."""
        return self.send("WATCHDOG=1")


def _one_line(text: str) -> str:
    return " ".join(text.split())

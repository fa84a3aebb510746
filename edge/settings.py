"""The daemon's settings: the server's ORTSERVE_* ones plus what systemd passes in."""

from __future__ import annotations

from pydantic import AliasChoices, Field

from core.settings import ServerSettings


class EdgeSettings(ServerSettings):
    """Settings of the edge daemon; one object per process, read once at start.

    systemd's variables keep their own names (no ORTSERVE_ prefix): a field with an
    alias is read from the alias alone.

    Attributes:
        notify_socket: `NOTIFY_SOCKET`: where sd_notify messages go (`@` starts an
            abstract-namespace name); unset outside systemd.
        watchdog_usec: `WATCHDOG_USEC`: systemd's watchdog interval; the daemon pings at
            half of it.
        watchdog_pid: `WATCHDOG_PID`: the process the watchdog is meant for; pings are
            sent only when it is this process (or unset).
    """

    notify_socket: str | None = Field(
        default=None, validation_alias=AliasChoices("NOTIFY_SOCKET", "notify_socket")
    )
    watchdog_usec: int | None = Field(
        default=None, ge=0, validation_alias=AliasChoices("WATCHDOG_USEC", "watchdog_usec")
    )
    watchdog_pid: int | None = Field(
        default=None, validation_alias=AliasChoices("WATCHDOG_PID", "watchdog_pid")
    )

"""The daemon's settings: the server's ORTSERVE_* ones plus what systemd passes in."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, field_validator

from ortserve.core.settings import ServerSettings


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
        read_timeout_s: A whole request, head and body, must arrive within this many
            seconds of its connection opening (or of the previous response on it), or the
            connection is closed: it bounds idle new connections and slow (slowloris)
            clients, which uvicorn alone never times out.
        keep_alive_s: A connection idle this long after a response is closed (uvicorn's
            `timeout_keep_alive`).
        log_level: The stderr log's level (ORTSERVE_LOG_LEVEL: DEBUG, INFO, WARNING,
            ERROR).
        log_format: How each request is logged (ORTSERVE_LOG_FORMAT): `json`, one JSON
            record per line on stdout (journald, log shippers); `text`, one access line
            in words on stderr, with the other log lines; `auto`, text when stderr is a
            terminal, else JSON.
        max_connections: Open connections at most, so slow clients cannot exhaust file
            descriptors or memory. One more closes the connection that has waited longest
            for its request (of the peer with the most open), or, when every connection
            has a request in progress, is closed itself as soon as it is accepted.
        max_connections_per_peer: Open connections from one peer (an IPv4 address, an
            IPv6 /64) at most; one more is closed as soon as it is accepted. Loopback
            counts as any peer: behind a reverse proxy on the same host every client is
            the proxy, so raise it to `max_connections` there.
        wait_for_model: When the model cannot load at start, stay up (/healthz 200,
            /readyz and generations 503 with the reason) until a reload (SIGHUP) loads
            one, instead of exiting 1. The systemd unit sets it: its start then times
            out without READY=1 and `Restart=` tries again, so a model installed after
            the unit started is served.
    """

    engine_process: bool = True  # see EngineSettings: a long-lived server's default
    notify_socket: str | None = Field(
        default=None, validation_alias=AliasChoices("NOTIFY_SOCKET", "notify_socket")
    )
    watchdog_usec: int | None = Field(
        default=None, ge=0, validation_alias=AliasChoices("WATCHDOG_USEC", "watchdog_usec")
    )
    watchdog_pid: int | None = Field(
        default=None, validation_alias=AliasChoices("WATCHDOG_PID", "watchdog_pid")
    )

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["auto", "json", "text"] = "auto"
    read_timeout_s: float = Field(default=10.0, gt=0, le=3600)

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    keep_alive_s: int = Field(default=5, ge=1, le=3600)
    max_connections: int = Field(default=256, ge=1, le=65536)
    max_connections_per_peer: int = Field(default=64, ge=1, le=65536)
    wait_for_model: bool = False

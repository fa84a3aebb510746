"""sd_notify without libsystemd: datagrams on a unix socket, as systemd receives them."""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ortserve.edge.notify import Notifier
from ortserve.edge.settings import EdgeSettings


@pytest.fixture
def listener() -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket at a short path (unix socket paths are limited to 108 bytes)."""
    with tempfile.TemporaryDirectory(prefix="sdn") as folder:
        path = str(Path(folder) / "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(path)
            sock.settimeout(2)
            yield path, sock


def test_messages_arrive_as_systemd_reads_them(listener: tuple[str, socket.socket]) -> None:
    path, sock = listener
    notifier = Notifier(path)
    assert notifier.ready("serving m on cpu\n at http://x")
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving m on cpu at http://x"
    assert notifier.status("loading")
    assert sock.recv(4096) == b"STATUS=loading"
    assert notifier.stopping("draining 1")
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=draining 1"
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"


def test_abstract_namespace_socket() -> None:
    name = f"ortserve-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(2)
        assert Notifier(f"@{name}").ready("up")
        assert sock.recv(4096).startswith(b"READY=1\n")


def test_without_systemd_nothing_is_sent_and_nothing_fails() -> None:
    notifier = Notifier(None, watchdog_usec=1_000_000)
    assert not notifier.enabled
    assert notifier.watchdog_interval_s is None
    assert not notifier.ready("up")


def test_a_dead_socket_is_not_fatal(tmp_path: Path) -> None:
    assert not Notifier(str(tmp_path / "gone")).ready("up")


def test_watchdog_interval_is_half_of_watchdog_usec_for_this_process_only() -> None:
    assert Notifier("@x", watchdog_usec=3_000_000).watchdog_interval_s == 1.5
    assert Notifier("@x", 3_000_000, watchdog_pid=os.getpid()).watchdog_interval_s == 1.5
    assert Notifier("@x", 3_000_000, watchdog_pid=os.getpid() + 1).watchdog_interval_s is None
    assert Notifier("@x", watchdog_usec=None).watchdog_interval_s is None


def test_systemd_variables_are_read_without_the_ortserve_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "@sd")
    monkeypatch.setenv("WATCHDOG_USEC", "20000000")
    monkeypatch.setenv("WATCHDOG_PID", "42")
    monkeypatch.setenv("ORTSERVE_PORT", "9001")
    settings = EdgeSettings()
    assert (settings.notify_socket, settings.watchdog_usec, settings.watchdog_pid) == (
        "@sd",
        20_000_000,
        42,
    )
    assert settings.port == 9001

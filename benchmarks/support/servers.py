"""The real `ortserve` console script, and server processes run until ready on loopback."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

# The real console script, installed beside the interpreter running (tests, benchmarks).
ORTSERVE = [str(Path(sys.executable).parent / "ortserve")]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def wait_ready(base_url: str, proc: Any, log: Any, timeout_s: float = 120) -> None:
    """Poll /readyz until 200; fail with the server's output if it dies, says its load
    failed, or times out."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            out = log.read()
            raise RuntimeError(f"server exited with {proc.returncode}:\n{out[-3000:]}")
        try:
            ready = httpx.get(f"{base_url}/readyz", timeout=2)
            if ready.status_code == 200:
                return
            if ready.json().get("status") == "failed":
                log.seek(0)
                raise RuntimeError(f"server load failed: {ready.text}\n{log.read()[-3000:]}")
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server at {base_url} not ready within {timeout_s} s")


@contextmanager
def serve_process(
    cmd: list[str],
    env: dict[str, str],
    base_url: str,
    cwd: Path | None = None,
    ready_timeout_s: float = 120,
) -> Iterator[subprocess.Popen[str]]:
    """Run a server process (its whole environment given) until /readyz answers 200; stop
    it with SIGTERM afterwards, failing loudly if it ignores that."""
    # A file, not a pipe: a server whose output nobody reads would block on a full pipe.
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
        )
        try:
            wait_ready(base_url, proc, log, ready_timeout_s)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                log.seek(0)
                message = f"server ignored SIGTERM for 30 s:\n{log.read()[-3000:]}"
                raise RuntimeError(message) from None


@contextmanager
def daemon(model_dir: Path, env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`ortserve serve` on a free loopback port with `env` as its whole environment, until
    ready; yields its URL and process (tests and benchmarks)."""
    port = free_port()
    cmd = [
        *ORTSERVE,
        "serve",
        "--model-dir",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    base = f"http://127.0.0.1:{port}"
    with serve_process(cmd, env, base) as proc:
        yield base, proc


def daemon_pids(base: str, pid: int) -> list[int]:
    """The daemon's process and, when it runs og in one, its engine process (/healthz
    says which): what a benchmark's memory and CPU figures of "the daemon" must count."""
    engine = httpx.get(f"{base}/healthz", timeout=30).json().get("engine") or {}
    child = engine.get("pid")
    return [pid, int(child)] if child else [pid]


def memory_kib(pids: list[int], key: str) -> int:
    """A `/proc/PID/status` memory field (VmRSS, VmHWM) in KiB, summed over `pids` (for
    VmHWM: the sum of each process's own peak, an upper bound of their peak together)."""
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                total += int(line.split()[1])
                break
        else:
            raise RuntimeError(f"no {key} for pid {pid}")
    return total

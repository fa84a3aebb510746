"""The real `ortserve` console script, and server processes run until ready on loopback."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import httpx

# The real console script, installed beside the interpreter running (tests, benchmarks).
ORTSERVE = [str(Path(sys.executable).parent / "ortserve")]


def free_port() -> int:
    """A TCP port free on every address right now, below the kernel's ephemeral range.

    A server started on it binds it seconds later (Python's imports); a port from the
    ephemeral range (what binding port 0 gives) could meanwhile become the local port of
    any outgoing connection, and the server's bind then fails with "Address already in
    use" (seen once in a suite run: a Cloud Run test binding 0.0.0.0). Ports below the
    range are never handed out for connections."""
    low = _ephemeral_low()
    pick = random.SystemRandom()
    for _ in range(200):
        port = pick.randrange(_FIRST_PORT, low)
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))  # noqa: S104 (a check that nothing holds it)
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free TCP port in {_FIRST_PORT}-{low - 1}")


# The lowest port free_port picks (well above the registered services most hosts run).
_FIRST_PORT = 20000


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="ascii")
        low = int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
    return low if low > _FIRST_PORT + 1000 else 32768


class ServerProcess:
    """A server process on loopback `port` (None: one that listens on none, as the Lambda
    runtime client), started with its argv and its whole environment, its output in files
    (a pipe nobody reads would block it); a context manager that stops it on exit.

    `stderr_apart`: stderr in a file of its own (else with stdout, in order). `group`: in a
    session of its own, so that signals reach the processes it starts too (`make demo`)."""

    def __init__(
        self,
        cmd: list[str],
        env: dict[str, str],
        port: int | None = None,
        *,
        cwd: Path | None = None,
        stderr_apart: bool = False,
        group: bool = False,
    ) -> None:
        self.port = port
        self._group = group
        self._folder = tempfile.TemporaryDirectory(prefix="ortserve-server-")
        # Read back by path, not through the handle the child writes with (a shared offset).
        self._out = Path(self._folder.name) / "stdout"
        self._err = Path(self._folder.name) / "stderr" if stderr_apart else self._out
        try:
            with contextlib.ExitStack() as files:
                out = files.enter_context(self._out.open("wb"))
                err = files.enter_context(self._err.open("wb")) if stderr_apart else None
                self.proc = subprocess.Popen(
                    cmd,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err or subprocess.STDOUT,
                    text=True,
                    start_new_session=group,
                )
        except BaseException:
            self._folder.cleanup()
            raise

    @property
    def base(self) -> str:
        """Its URL on loopback."""
        assert self.port is not None, "this process listens on no port"
        return f"http://127.0.0.1:{self.port}"

    def stdout(self) -> str:
        """What it has written to stdout (and to stderr, unless `stderr_apart`)."""
        return self._out.read_text(errors="replace")

    def stderr(self) -> str:
        """What it has written to stderr (and to stdout, unless `stderr_apart`)."""
        return self._err.read_text(errors="replace")

    def _tail(self) -> str:
        """The end of its output, for a failure's message."""
        tail = self.stdout()[-3000:]
        return tail if self._err == self._out else f"{tail}\nstderr:\n{self.stderr()[-3000:]}"

    def wait_ready(self, timeout_s: float = 120, path: str = "/readyz") -> None:
        """Poll `path` (/readyz; llama-server's is /health) until 200; fail with its output
        if it exits, says its load failed, or is not ready within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self._tail()}")
            try:
                ready = httpx.get(f"{self.base}{path}", timeout=2)
                if ready.status_code == 200:
                    return
                if ready.json().get("status") == "failed":  # it will not come: say why now
                    raise RuntimeError(f"server load failed: {ready.text}\n{self._tail()}")
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server at {self.base} not ready within {timeout_s} s:\n{self._tail()}")

    def wait_listening(self, timeout_s: float = 60) -> None:
        """Until its port takes connections, its model in or not (a request sent then waits
        for the load); fail with its output if it exits first or `timeout_s` passes."""
        assert self.port is not None, "this process listens on no port"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    code = self.proc.returncode
                    raise RuntimeError(f"server exited with {code}:\n{self._tail()}") from None
                if time.monotonic() > deadline:
                    message = f"server did not listen within {timeout_s} s:\n{self._tail()}"
                    raise RuntimeError(message) from None
                time.sleep(0.005)

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # it (or its whole group) has gone
            if self._group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM (to its group, with `group`) unless it has exited, then its exit code;
        killed, and an error with its output, if it has not exited within `timeout_s`."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait()
            message = f"server ignored SIGTERM for {timeout_s:g} s:\n{self._tail()}"
            raise RuntimeError(message) from None

    def close(self) -> None:
        """Stop it if it runs, kill what is left of its group, and drop its output."""
        try:
            self.stop()
        finally:
            if self._group:
                self._signal(signal.SIGKILL)
            self._folder.cleanup()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


@contextmanager
def serve_process(
    cmd: list[str],
    env: dict[str, str],
    port: int,
    *,
    cwd: Path | None = None,
    ready_timeout_s: float = 120,
    stderr_apart: bool = False,
    group: bool = False,
    ready_path: str = "/readyz",
) -> Iterator[ServerProcess]:
    """A `ServerProcess` (its whole environment given) once its `ready_path` answers 200;
    stopped with SIGTERM afterwards, failing loudly if it ignores that."""
    with ServerProcess(cmd, env, port, cwd=cwd, stderr_apart=stderr_apart, group=group) as server:
        server.wait_ready(ready_timeout_s, ready_path)
        yield server


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
    with serve_process(cmd, env, port) as server:
        yield server.base, server.proc


def functions_framework(bundle: Path, env: dict[str, str]) -> ServerProcess:
    """The real functions-framework server on a baked Cloud Functions bundle, as its
    buildpack runs it (in the bundle, on its PYTHONPATH), on a free loopback port, with
    `env` as its whole environment besides; started, not yet waited for."""
    port = free_port()
    cmd = [
        str(Path(sys.executable).parent / "functions-framework"),
        "--source",
        "main.py",
        "--target",
        "ortserve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    return ServerProcess(cmd, {**env, "PYTHONPATH": str(bundle)}, port, cwd=bundle)


def daemon_pids(base: str, pid: int) -> list[int]:
    """The daemon's process and, when it runs og in one, its engine process: what a
    benchmark's memory and CPU figures of "the daemon" must count. The engine process is
    the daemon's child (/proc), since /healthz names its pid to a request with a key only.
    """
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        children += [int(child) for child in task.read_text().split()]
    return [pid, *sorted(set(children))]


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

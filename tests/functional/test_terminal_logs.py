"""What `ortserve serve` says at a terminal (#27 item 10): a short ready line, then one
access line in words per request (a refusal with its reason), and no JSON; with
ORTSERVE_LOG_FORMAT=json the records are JSON on stdout again."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import httpx

from benchmarks.support.servers import ORTSERVE, free_port
from tests.functional.harness import ready_within

_STAMP = rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "


class _Pty:
    """A command whose stdin, stdout and stderr are one pseudo-terminal."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child
            os.execve(argv[0], argv, env)
        self.seen = b""

    def expect(self, pattern: bytes, timeout: float = 60) -> bytes:
        """Read until `pattern` is on the terminal; everything read so far."""
        deadline = time.monotonic() + timeout
        while re.search(pattern, self.seen) is None:
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} in {self.seen[-3000:]!r}"
            if select.select([self.fd], [], [], left)[0]:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:  # EIO: the child closed the terminal
                    data = b""
                assert data, f"the terminal closed before {pattern!r}: {self.seen[-3000:]!r}"
                self.seen += data
        return self.seen

    def stop(self) -> int:
        """SIGINT (Ctrl-C), then its exit code."""
        os.kill(self.pid, signal.SIGINT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            if select.select([self.fd], [], [], 0.1)[0]:
                with contextlib.suppress(OSError):  # EIO: the child closed the terminal
                    self.seen += os.read(self.fd, 65536)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"still running: {self.seen[-2000:]!r}")


def test_at_a_terminal_each_request_is_one_line_in_words(tiny_model_dir: Path) -> None:
    port = free_port()
    env = {**os.environ, "ORTSERVE_PROVIDERS": "auto"}
    env.pop("ORTSERVE_LOG_FORMAT", None)
    term = _Pty([*ORTSERVE, "serve", "--model-dir", str(tiny_model_dir), "--port", str(port)],
                env)  # fmt: skip
    try:
        term.expect(rb"playground at http://127\.0\.0\.1:\d+/\r?\n")
        base = f"http://127.0.0.1:{port}"
        assert httpx.post(f"{base}/generate", json={"prompt": "Hi", "max_new_tokens": 4}).is_success
        refused = httpx.post(f"{base}/generate", json={"prompt": "Hi", "max_new_tokens": -1})
        assert refused.status_code == 400
        seen = term.expect(rb"POST /generate 400 [^\r\n]*\r?\n")
    finally:
        assert term.stop() == 130
    lines = seen.decode().splitlines()
    ready = next(line for line in lines if " ready on " in line)
    # The model, its EP and threads; which providers are missing is in /readyz (and DEBUG).
    assert re.search(r"model \S+ ready on cpu, \d+ threads \(loaded in ", ready), ready
    message = ready.split(" ortserve: ", 1)[1]  # after the time and level
    assert len(message) < 110 and "not installed" not in ready and "skipped" not in ready, ready
    took = r"[\d.]+ m?s"  # "7 ms", "1.20 s" on a busy machine
    served = next(line for line in lines if "POST /generate 200 " in line)
    # Random weights may end early (stop) or not (length).
    figures = rf"prompt \d+ \+ \d+ new tokens, [\d.]+ tok/s, TTFT {took}, (length|stop)"
    assert re.search(rf"ortserve\.access: POST /generate 200 {took}: {figures}$", served), served
    refusal = "invalid_request: max_new_tokens: Input should be greater than or equal to 1"
    assert re.search(rf"ortserve\.access: POST /generate 400 {took}: {refusal}$", lines[-1])
    assert "{" not in seen.decode(), seen  # no JSON record on the terminal


def test_asked_for_json_records_go_to_stdout_with_their_reason(tiny_model_dir: Path) -> None:
    port = free_port()
    cmd = [*ORTSERVE, "serve", "--model-dir", str(tiny_model_dir), "--port", str(port),
           "--log-format", "json"]  # fmt: skip
    env = {**os.environ, "ORTSERVE_PROVIDERS": "cpu", "ORTSERVE_LOG_FORMAT": "text"}
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert ready_within(proc, port, 120)
        httpx.get(f"http://127.0.0.1:{port}/nope")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert "ortserve.access" not in err, err
    records = [line for line in out.splitlines() if '"route":"/nope"' in line]
    assert len(records) == 1 and '"reason":"not_found: no route /nope"' in records[0], out

"""A command in a pseudo-terminal, for tests of what a person at a terminal sees."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import signal
import time


class Terminal:
    """A command in a pseudo-terminal (its stdin, stdout and stderr), as a person at a
    terminal runs it."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the terminal is its stdin, stdout and stderr
            # SIGINT at its default, as a shell at a terminal starts a command: a test run
            # started in the background without job control inherits it ignored, and the
            # Ctrl-C typed here would be ignored too (exec keeps an ignored signal).
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(argv[0], argv, env)
        self.seen = b""

    def expect(self, pattern: bytes, timeout: float = 60) -> bytes:
        """Read until `pattern`; what came before and including it."""
        deadline = time.monotonic() + timeout
        while (match := re.search(pattern, self.seen)) is None:
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} in {self.seen[-2000:]!r}"
            if select.select([self.fd], [], [], left)[0]:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:  # EIO: the child closed the terminal
                    data = b""
                assert data, f"the terminal closed before {pattern!r}: {self.seen[-2000:]!r}"
                self.seen += data
        out, self.seen = self.seen[: match.end()], self.seen[match.end() :]
        return out

    def drain(self, quiet_s: float = 0.5) -> None:
        """Read what the terminal holds until it stays quiet for `quiet_s`."""
        while select.select([self.fd], [], [], quiet_s)[0]:
            try:
                self.seen += os.read(self.fd, 65536)
            except OSError:
                return

    def type(self, text: bytes) -> None:
        os.write(self.fd, text)

    def exit_code(self, timeout: float = 30) -> int:
        """The child's exit code, once it ends (reading the terminal until then)."""
        deadline = time.monotonic() + timeout
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

    def stop(self) -> int:
        """Ctrl-C (SIGINT), then the exit code."""
        os.kill(self.pid, signal.SIGINT)
        return self.exit_code()

"""What the bake says to its user: progress lines, and its one error type (a one-line reason)."""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import IO, Protocol


def say(message: str) -> None:
    """One progress line on stderr."""
    print(f"[bake] {message}", file=sys.stderr, flush=True)


class BakeError(Exception):
    """The bake cannot go on; the message is one line a user can act on."""


# How often a long step says it is still running: a line at least every 15 s (docs/
# getting-started.md), with the tick's second of slack.
HEARTBEAT_S = 10.0
# How often a running step's progress is asked to move on (a bar's clock, a report).
_TICK_S = 1.0


class StepProgress(Protocol):
    """What a step's output means for its progress (bake.progress.BuilderProgress)."""

    def feed(self, line: str) -> None:
        """One line of the step's stdout or stderr (from either reader thread)."""

    def beat(self) -> None:
        """Time passes (about once a second)."""

    def close(self) -> None:
        """The step ended."""


class _Reader(threading.Thread):
    """Reads one of a step's pipes as it comes: all of it is kept (the failure message
    quotes the log), each line (or `\\r`-separated segment: a progress bar's update) goes
    to `progress`."""

    def __init__(self, pipe: IO[bytes], progress: StepProgress | None) -> None:
        super().__init__(daemon=True)
        self._pipe = pipe
        self._progress = progress
        self._parts: list[str] = []

    def run(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pending = ""
        while True:
            try:
                chunk = os.read(self._pipe.fileno(), 1 << 16)  # what is there, not 64 KiB
            except (OSError, ValueError):  # closed under it: the step was stopped (Ctrl-C)
                chunk = b""
            text = decoder.decode(chunk, final=not chunk)
            self._parts.append(text)
            if self._progress is not None:
                *lines, pending = _LINE_END.split(pending + text)
                for line in lines:
                    self._progress.feed(line)
            if not chunk:
                break
        if self._progress is not None and pending:
            self._progress.feed(pending)

    def text(self) -> str:
        """Everything read, with universal newlines (as `text=True` gives)."""
        return "".join(self._parts).replace("\r\n", "\n").replace("\r", "\n")


_LINE_END = re.compile(r"\r\n|\r|\n")


class _SignalsHeld:
    """SIGINT and SIGTERM held while a step starts, until its process is owned.

    Popen() returns only after the child's exec, and the reader threads start after it:
    a signal in between raised where no `except` stopped the child (Popen() gives no
    object to kill; Popen's exit waits 0.25 s after a Ctrl-C and leaves it), so the
    builder, gigabytes of memory, went on alone. Held, the signal is delivered
    (`release`) inside the `try` that stops the step on the way out. In the main thread
    only (Python runs signal handlers there); elsewhere nothing is held.
    """

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._pending: list[int] = []
        self._previous: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in self._SIGNALS:
                self._previous[signum] = signal.signal(signum, self._hold)

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        self._pending.append(signum)

    def restore(self) -> None:
        """Put the handlers back (the held signals are dropped: the step is stopping)."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]  # what signal() gave

    def release(self) -> None:
        """Put the handlers back and deliver the held signals to them."""
        self.restore()
        pending, self._pending = self._pending, []
        for signum in pending:
            signal.raise_signal(signum)


@contextlib.contextmanager
def heartbeat(what: str, tell: Callable[[str], None] = say) -> Iterator[None]:
    """While the block runs, `WHAT: still running (N s)` every HEARTBEAT_S seconds (a
    thread; for a step that says nothing for long: a subprocess without progress, the
    GGUF conversion, the quality gate). `tell` writes the line."""
    start = time.monotonic()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            tell(f"{what}: still running ({time.monotonic() - start:.0f} s)")

    thread = threading.Thread(target=beat, name=f"heartbeat: {what}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _wait(
    proc: subprocess.Popen[bytes],
    start: float,
    timeout: float | None,
    progress: StepProgress | None,
) -> None:
    """Wait for a step's end, its progress moved on each tick;
    `subprocess.TimeoutExpired` past `timeout`."""
    while True:
        wait = _TICK_S
        if timeout is not None:
            wait = min(wait, max(0.0, start + timeout - time.monotonic()))
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if timeout is not None and now - start >= timeout:
                raise subprocess.TimeoutExpired(proc.args, timeout) from None
            if progress is not None:
                progress.beat()


def run_step(
    cmd: list[str],
    what: str,
    *,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    progress: StepProgress | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a long subprocess step (the model builder, pip), its output captured; its
    output lines go to `progress` as they come, or, without one, a heartbeat line every
    HEARTBEAT_S seconds says that it is alive.

    Raises:
        subprocess.TimeoutExpired: It ran past `timeout` (it is killed first).
    """
    start = time.monotonic()
    held = _SignalsHeld()
    try:
        # A process group of its own: stopping the step stops what it started too (the
        # builder runs helpers: a compiler probe, ldconfig), and a terminal's Ctrl-C comes
        # to the bake alone, which then stops the step.
        started = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, process_group=0
        )
    except BaseException:
        held.release()  # it did not start: a Ctrl-C that came meanwhile still counts
        raise
    readers: list[_Reader] = []
    with started as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None  # both piped
            readers = [_Reader(proc.stdout, progress), _Reader(proc.stderr, progress)]
            for reader in readers:
                reader.start()
            held.release()  # a Ctrl-C or SIGTERM that came while it started: stop it now
            with heartbeat(what) if progress is None else contextlib.nullcontext():
                _wait(proc, start, timeout, progress)
            for reader in readers:
                reader.join()
        except BaseException:
            held.restore()
            # A timeout, Ctrl-C or SIGTERM (core.cli): the step dies with us, or Popen's
            # exit would wait minutes for it (SIGTERM) or leave it writing into the bake's
            # temporary folder while that is removed (Ctrl-C: it waits 0.25 s only).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()  # gone before the caller's clean-up removes its folder
            for reader in readers:  # at the pipes' end now: done before they are closed
                reader.join(timeout=1.0)
            raise
        finally:
            if progress is not None:
                progress.close()
    return subprocess.CompletedProcess(cmd, proc.returncode, readers[0].text(), readers[1].text())


def _main(argv: list[str]) -> int:
    """`python -P build/bake/errors.py WHAT CMD...`: CMD, its output as it is, with WHAT's
    heartbeat on stdout (the Makefile's pip install: silent for minutes while it unpacks
    torch). A script, as the package is not installed yet; -P keeps build/bake off
    sys.path (its gguf.py would hide the `gguf` package)."""
    what, *cmd = argv
    with heartbeat(what, lambda line: print(line, flush=True)):
        try:
            return subprocess.call(cmd)
        except KeyboardInterrupt:  # the terminal's Ctrl-C reached the command too
            return 130


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

"""What the bake says to its user: progress lines, and its one error type (a one-line reason)."""

from __future__ import annotations

import codecs
import os
import re
import subprocess
import sys
import threading
import time
from typing import IO, Protocol


def say(message: str) -> None:
    """One progress line on stderr."""
    print(f"[bake] {message}", file=sys.stderr, flush=True)


class BakeError(Exception):
    """The bake cannot go on; the message is one line a user can act on."""


# How often a long step says it is still running.
HEARTBEAT_S = 15.0
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
    last_beat = start
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as proc:
        assert proc.stdout is not None and proc.stderr is not None  # both piped
        readers = [_Reader(proc.stdout, progress), _Reader(proc.stderr, progress)]
        for reader in readers:
            reader.start()
        try:
            while True:
                wait = min(_TICK_S, HEARTBEAT_S)
                if timeout is not None:
                    wait = min(wait, max(0.0, start + timeout - time.monotonic()))
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    now = time.monotonic()
                    if timeout is not None and now - start >= timeout:
                        raise subprocess.TimeoutExpired(cmd, timeout) from None
                    if progress is not None:
                        progress.beat()
                    elif now - last_beat >= HEARTBEAT_S:
                        last_beat = now
                        say(f"{what}: still running ({now - start:.0f} s)")
            for reader in readers:
                reader.join()
        except BaseException:
            # A timeout, Ctrl-C or SIGTERM (core.cli): the step dies with us, or Popen's
            # exit would wait minutes for it (SIGTERM) or leave it writing into the bake's
            # temporary folder while that is removed (Ctrl-C: it waits 0.25 s only).
            proc.kill()
            proc.wait()  # gone before the caller's clean-up removes its folder
            for reader in readers:  # at the pipes' end now: done before they are closed
                reader.join(timeout=1.0)
            raise
        finally:
            if progress is not None:
                progress.close()
    return subprocess.CompletedProcess(cmd, proc.returncode, readers[0].text(), readers[1].text())

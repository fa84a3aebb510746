"""What the bake says to its user: progress lines, and its one error type (a one-line reason)."""

from __future__ import annotations

import subprocess
import sys
import time


def say(message: str) -> None:
    """One progress line on stderr."""
    print(f"[bake] {message}", file=sys.stderr, flush=True)


class BakeError(Exception):
    """The bake cannot go on; the message is one line a user can act on."""


# How often a long step says it is still running.
HEARTBEAT_S = 15.0


def run_step(
    cmd: list[str], what: str, *, env: dict[str, str] | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a long subprocess step (the model builder, pip), its output captured, with a
    heartbeat line every HEARTBEAT_S seconds so that a person sees it is alive.

    Raises:
        subprocess.TimeoutExpired: It ran past `timeout` (it is killed first).
    """
    start = time.monotonic()
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        while True:
            wait = HEARTBEAT_S
            if timeout is not None:
                wait = min(wait, max(0.0, start + timeout - time.monotonic()))
            try:
                out, err = proc.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - start
                if timeout is not None and elapsed >= timeout:
                    proc.kill()
                    proc.communicate()
                    raise
                say(f"{what}: still running ({elapsed:.0f} s)")
            except BaseException:
                # Ctrl-C or SIGTERM (core.cli): the step dies with us, or Popen's exit
                # would wait minutes for it (SIGTERM) or leave it writing into the bake's
                # temporary folder while that is removed (Ctrl-C: it waits 0.25 s only).
                proc.kill()
                proc.wait()  # gone before the caller's clean-up removes its folder
                raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

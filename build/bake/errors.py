"""What the bake says to its user: progress lines, and its one error type (a one-line reason)."""

from __future__ import annotations

import sys


def say(message: str) -> None:
    """One progress line on stderr."""
    print(f"[bake] {message}", file=sys.stderr, flush=True)


class BakeError(Exception):
    """The bake cannot go on; the message is one line a user can act on."""

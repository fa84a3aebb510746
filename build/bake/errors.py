"""The bake's one error type: a one-line, user-facing reason."""

from __future__ import annotations


class BakeError(Exception):
    """The bake cannot go on; the message is one line a user can act on."""

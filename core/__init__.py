"""ortserve core: the engine, the model manifest and the HTTP semantics shared by every target."""

from __future__ import annotations

from functools import cache


@cache
def version() -> str:
    """ortserve's version: its installed metadata's, else `0.0.0` (a source tree that is
    not installed, as in the Lambda and GCF bundles; a version Ollama's clients parse)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("ortserve")
    except PackageNotFoundError:
        return "0.0.0"

"""Logging of the daemon: request records go to stdout as JSON lines (`core.logs.JsonLog`),
the rest to stderr as text (configured here)."""

from __future__ import annotations

import logging
import sys
import time


def configure_stderr_logging(level: int | str = logging.INFO) -> None:
    """Everything but request records goes to stderr, one line each with its time (UTC,
    ISO 8601) and level; uvicorn's loggers propagate here too."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter(
        "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S"
    )
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)

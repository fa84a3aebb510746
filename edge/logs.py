"""Logging of the daemon: request records as JSON lines on stdout, the rest on stderr."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from dataclasses import asdict
from typing import TextIO

from core.records import RequestRecord


class JsonLines:
    """Writes each request record as one JSON line, flushed at once (journald: one entry
    per line). Records come from worker threads; a lock keeps lines whole."""

    def __init__(self, stream: TextIO) -> None:
        """Write to `stream` (the daemon uses stdout)."""
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, record: RequestRecord) -> None:
        """Write `record` as one line."""
        fields = {
            name: round(value, 6) if isinstance(value, float) else value
            for name, value in asdict(record).items()
        }
        line = json.dumps({"event": "request", **fields}, separators=(",", ":"))
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


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

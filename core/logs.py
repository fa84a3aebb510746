"""JSON-line logs: one JSON object per line on stdout, the format every target writes.

journald, CloudWatch Logs and Cloud Logging each parse one JSON object per line, so the
edge daemon, both Lambda images and Cloud Functions log through `JsonLog`: a level, a
message and fields, and one line per request record. No engine is imported here.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any, TextIO

from core.records import RequestRecord


def record_fields(record: RequestRecord) -> dict[str, Any]:
    """The fields of `record`, times rounded to the microsecond."""
    return {
        name: round(value, 6) if isinstance(value, float) else value
        for name, value in asdict(record).items()
    }


class JsonLog:
    """Writes one JSON object per line, flushed at once (one log entry per line).

    Lines come from worker threads: each is written in one call under a lock, so lines
    never interleave (print() writes the text and the newline apart).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        level_key: str = "level",
        context: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        """Write to `stream`, or to whatever `sys.stdout` is at each write.

        Args:
            stream: Where lines go; None: the current `sys.stdout`.
            level_key: The level's field name: `level`, or `severity` for Cloud Logging.
            context: Fields added to each line as it is written (e.g. the id of the
                invoke being answered).
        """
        self._stream = stream
        self._level_key = level_key
        self._context = context
        self._lock = threading.Lock()

    def write(self, level: str, message: str, **fields: Any) -> None:
        """One line: `{level_key: level, "message": message, **fields}`.

        Values JSON cannot encode are written as their `str()`.
        """
        context = self._context() if self._context is not None else {}
        self._line({self._level_key: level, "message": message, **fields, **context})

    def record(self, record: RequestRecord, **extra: Any) -> None:
        """One request record: message and event `request`, the record's fields, `extra`."""
        self.write("INFO", "request", event="request", **record_fields(record), **extra)

    def _line(self, fields: Mapping[str, Any]) -> None:
        line = json.dumps(fields, separators=(",", ":"), default=str) + "\n"
        stream = self._stream if self._stream is not None else sys.stdout
        with self._lock:
            stream.write(line)
            stream.flush()

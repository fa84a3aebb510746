"""Logging of the daemon: the log lines go to stderr as text (configured here); each
request is one JSON record on stdout (`core.logs.JsonLog`), or, at a terminal, one access
line in words among the stderr lines (`core.logs.access_line`)."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

from ortserve.core.logs import JsonLog, access_line
from ortserve.core.records import RequestRecord

access_log = logging.getLogger("ortserve.access")


def configure_stderr_logging(level: int | str = logging.INFO) -> None:
    """Everything but JSON request records goes to stderr, one line each with its time
    (UTC, ISO 8601) and level; uvicorn's loggers propagate here too."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter(
        "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S"
    )
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def records_as_text(log_format: str, stderr: TextIO | None = None) -> bool:
    """Whether request records are access lines (`text`, or `auto` with a terminal on
    `stderr`, default `sys.stderr`) rather than JSON on stdout."""
    if log_format != "auto":
        return log_format == "text"
    stream = stderr if stderr is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class RequestLog:
    """Writes each request record once: as JSON on stdout, or as an access line on the
    stderr log (a 5xx at WARNING, the rest at INFO, so ORTSERVE_LOG_LEVEL filters them)."""

    def __init__(self, as_text: bool, stdout: TextIO | None = None) -> None:
        """`as_text`: access lines (`records_as_text`); `stdout`: where JSON goes (None:
        the current `sys.stdout`)."""
        self.as_text = as_text
        self._json = JsonLog(stdout)

    def record(self, record: RequestRecord) -> None:
        """Log one finished request."""
        if not self.as_text:
            self._json.record(record)
            return
        level = logging.WARNING if record.status >= 500 else logging.INFO
        access_log.log(level, "%s", access_line(record))

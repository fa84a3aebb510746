"""Logging of the daemon: the log lines go to stderr as text (configured here); each
request is one JSON record on stdout (`core.logs.JsonLog`), or, at a terminal, one access
line in words among the stderr lines (`core.logs.access_line`). Each line's control
characters are escaped (`core.logs.escaped`): request text cannot forge a line."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

from ortserve.core.logs import JsonLog, access_line, escaped
from ortserve.core.records import RequestRecord

access_log = logging.getLogger("ortserve.access")


class EscapingFormatter(logging.Formatter):
    """A text formatter whose lines say what a request sent, never obey it: a message
    (a path, a field's name) is one line, its control characters escaped; a traceback
    keeps its lines, each escaped."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        """The line, escaped (`core.logs.escaped`)."""
        return escaped(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:  # noqa: N802 (logging's name)
        """The traceback, each of its lines escaped."""
        return "\n".join(escaped(line) for line in super().formatException(ei).split("\n"))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802 (logging's name)
        """The stack, each of its lines escaped."""
        return "\n".join(escaped(line) for line in super().formatStack(stack_info).split("\n"))


def stderr_formatter() -> logging.Formatter:
    """The stderr lines' format: time (UTC, ISO 8601), level, logger and message, escaped."""
    formatter = EscapingFormatter(
        "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S"
    )
    formatter.converter = time.gmtime
    return formatter


def configure_stderr_logging(level: int | str = logging.INFO) -> None:
    """Everything but JSON request records goes to stderr, one line each with its time
    (UTC, ISO 8601) and level (`stderr_formatter`); uvicorn's loggers propagate here too."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(stderr_formatter())
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

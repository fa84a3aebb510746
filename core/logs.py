"""JSON-line logs: one JSON object per line on stdout, the format every target writes;
and the access line a person reads at a terminal.

journald, CloudWatch Logs and Cloud Logging each parse one JSON object per line, so the
edge daemon, both Lambda images and Cloud Functions log through `JsonLog`: a level, a
message and fields, and one line per request record. At a terminal the edge daemon writes
`access_line` instead (edge.logs). No engine is imported here.

Every format writes request-supplied text (a path, an unknown field's name, a reason)
through `escaped`, so no request can end a log line early or start a forged one.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any, TextIO

from ortserve.core.records import RequestRecord

# C0 controls (newline, carriage return, ESC ...), DEL, C1 controls (NEL ...), the line and
# paragraph separators, and lone surrogates (which no UTF-8 stream can write).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def escaped(text: str) -> str:
    """`text` with each control character written as a JSON escape (`\\u000a` for a
    newline, `\\u001b` for ESC): one log line stays one line, and a terminal shows it as
    sent rather than obeying it.

    The escape is JSON's own, so a JSON line passed through it stays valid JSON; applying
    it twice changes nothing more.
    """
    return _UNSAFE.sub(_escape, text)


def record_fields(record: RequestRecord) -> dict[str, Any]:
    """The fields of `record`, times rounded to the microsecond."""
    return {
        name: round(value, 6) if isinstance(value, float) else value
        for name, value in asdict(record).items()
    }


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.0f} ms"


def access_line(record: RequestRecord) -> str:
    """One request in words: method, route, status, time; for a generation its prompt and
    new tokens, decode speed, time to the first token and how it ended; for an error why.

    `POST /v1/chat/completions 200 1.35 s: prompt 12 + 64 new tokens, 48.3 tok/s,
    TTFT 31 ms, stop`; `POST /generate 400 0 ms: invalid_request: max_new_tokens: ...`.
    """
    parts: list[str] = []
    if record.prompt_tokens or record.completion_tokens:
        parts.append(f"prompt {record.prompt_tokens} + {record.completion_tokens} new tokens")
        if record.tokens_per_s:
            parts.append(f"{record.tokens_per_s:.1f} tok/s")
        if record.ttft_s:
            parts.append(f"TTFT {_seconds(record.ttft_s)}")
        if record.draft_tokens:
            parts.append(f"{record.accepted_tokens} of {record.draft_tokens} drafts accepted")
    if record.ending:
        parts.append(record.ending)
    if record.filtered:
        parts.append(f"filtered by {record.filtered}")
    if record.redactions:
        parts.append(f"{record.redactions} redacted")
    if record.reason:
        parts.append(record.reason)
    head = f"{record.method} {record.route} {record.status} {_seconds(record.duration_s)}"
    return escaped(f"{head}: {', '.join(parts)}" if parts else head)


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

        Values JSON cannot encode are written as their `str()`; control characters in
        any value are escaped (`escaped`).
        """
        context = self._context() if self._context is not None else {}
        self._line({self._level_key: level, "message": message, **fields, **context})

    def record(self, record: RequestRecord, **extra: Any) -> None:
        """One request record: message and event `request`, the record's fields, `extra`."""
        self.write("INFO", "request", event="request", **record_fields(record), **extra)

    def _line(self, fields: Mapping[str, Any]) -> None:
        # ASCII JSON escapes every control character already, in the form `escaped`
        # writes; passing the line through it keeps that so whatever the encoder does.
        encoded = json.dumps(fields, ensure_ascii=True, separators=(",", ":"), default=str)
        line = escaped(encoded) + "\n"
        stream = self._stream if self._stream is not None else sys.stdout
        with self._lock:
            stream.write(line)
            stream.flush()

"""The framework-free HTTP boundary every adapter translates to and from: requests,
responses, the error body and the SSE encoding (no engine, no onnxruntime-genai)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.errors import (
    BusyError,
    DrainingError,
    MethodNotAllowedError,
    ModelUnavailableError,
    OrtServeError,
)

JSON = "application/json"
SSE = "text/event-stream"


@dataclass(frozen=True)
class Request:
    """One HTTP request as the core sees it.

    Attributes:
        method: Upper-case HTTP method.
        path: The path without the query string, e.g. `/v1/chat/completions`.
        query: Query parameters (last value wins).
        headers: Header names in lower case.
        body: The raw body.
        cancelled: Set by the adapter when the client has gone away while the answer is
            computed: a buffered generation stops at its next token and a request waiting
            for a slot leaves the queue at once (its record says 499; nothing is sent).
    """

    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)


@dataclass
class Response:
    """One HTTP response: a whole body, or an iterator of chunks (SSE).

    A streamed body should be iterated to its end or closed (`close_body`), so that
    the generation behind it stops and frees its slot.
    """

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | Iterator[bytes] = b""

    @property
    def is_stream(self) -> bool:
        """True when the body is an iterator of chunks."""
        return not isinstance(self.body, bytes)

    def header(self, name: str) -> str | None:
        """The first value of header `name` (case-insensitive), or None."""
        lower = name.lower()
        return next((v for k, v in self.headers if k.lower() == lower), None)

    def close_body(self) -> None:
        """Stop a streamed body early (the client went away)."""
        close = getattr(self.body, "close", None)
        if close is not None:
            close()


def json_response(
    status: int, payload: Any, headers: list[tuple[str, str]] | None = None
) -> Response:
    """A JSON response (compact, UTF-8)."""
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    return Response(status, [("content-type", JSON), *(headers or [])], body)


def sse_response(chunks: Iterator[bytes]) -> Response:
    """A Server-Sent Events response with the headers proxies need to not buffer it."""
    headers = [
        ("content-type", f"{SSE}; charset=utf-8"),
        ("cache-control", "no-cache"),
        ("x-accel-buffering", "no"),
    ]
    return Response(200, headers, chunks)


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    503: "server_error",
    504: "server_error",
}


def error_payload(exc: OrtServeError) -> dict[str, Any]:
    """The OpenAI-shaped error body for `exc`."""
    kind = _ERROR_TYPES.get(exc.status, "server_error")
    param = getattr(exc, "param", None)
    return {"error": {"message": exc.message, "type": kind, "param": param, "code": exc.code}}


def error_response(exc: OrtServeError) -> Response:
    """The HTTP response for an ortserve error (the one place errors become HTTP)."""
    headers: list[tuple[str, str]] = []
    if isinstance(exc, BusyError):
        headers.append(("retry-after", str(int(exc.retry_after_s))))
    elif isinstance(exc, DrainingError) or (
        isinstance(exc, ModelUnavailableError) and exc.retryable
    ):
        headers.append(("retry-after", "5"))
    if isinstance(exc, MethodNotAllowedError):
        headers.append(("allow", ", ".join(exc.allowed)))
    return json_response(exc.status, error_payload(exc), headers)


def sse_event(payload: Any) -> bytes:
    """One server-sent event carrying `payload` as compact JSON."""
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"

"""The framework-free HTTP boundary every adapter translates to and from: requests,
responses, the error body and the SSE encoding (no engine, no onnxruntime-genai)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ortserve.core.errors import (
    BusyError,
    DrainingError,
    MethodNotAllowedError,
    ModelUnavailableError,
    OrtServeError,
)

JSON = "application/json"
SSE = "text/event-stream"


def fold(name: str, values: Iterable[str]) -> str:
    """The values of a repeated header as one (RFC 9110 §5.3): joined with `, `, and
    Cookie with `; ` (RFC 6265 §5.4), the one rule every adapter follows."""
    return ("; " if name.lower() == "cookie" else ", ").join(values)


class Headers(Mapping[str, str]):
    """A request's headers: case-insensitive names, every value of a repeated one kept.

    As a mapping it has one value per name, the values folded (`fold`); `get_all` gives
    them apart. Names iterate in lower case, in the order first seen. Immutable.
    """

    __slots__ = ("_values",)

    def __init__(self, headers: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        """Headers from a mapping or from (name, value) pairs, names in any case."""
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        values: dict[str, list[str]] = {}
        for name, value in pairs:
            values.setdefault(name.lower(), []).append(value)
        self._values = values

    def __getitem__(self, name: str) -> str:
        """The folded value of `name` (any case); KeyError when absent."""
        return fold(name, self._values[name.lower()])

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Headers({list(self.pairs())!r})"

    def get_all(self, name: str) -> list[str]:
        """Every value of `name` (any case), in order; empty when absent."""
        return list(self._values.get(name.lower(), ()))

    def pairs(self) -> Iterator[tuple[str, str]]:
        """(lower-case name, value) for each value received."""
        return ((name, value) for name, values in self._values.items() for value in values)


@dataclass(frozen=True)
class Request:
    """One HTTP request as the core sees it.

    Attributes:
        method: Upper-case HTTP method.
        path: The path without the query string, e.g. `/v1/chat/completions`.
        headers: The headers (case-insensitive; repeated ones folded by one rule).
        body: The raw body.
        cancelled: Set by the adapter when the client has gone away while the answer is
            computed: a buffered generation stops at its next token and a request waiting
            for a slot leaves the queue at once (its record says 499; nothing is sent).
        deadline: When the platform cuts the answer off (`time.monotonic()` seconds; e.g.
            a Lambda invoke's remaining time less a margin): a generation still running
            then ends with a timeout error the client can read, before the platform kills
            it without one. None: only ORTSERVE_REQUEST_TIMEOUT_S applies.
    """

    method: str
    path: str
    headers: Headers = field(default_factory=Headers)
    body: bytes = b""
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    deadline: float | None = field(default=None, compare=False)


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
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",  # a conflict with the server's state, as OpenAI's are
    413: "invalid_request_error",
    503: "server_error",
    504: "server_error",
}


def error_payload(exc: OrtServeError) -> dict[str, Any]:
    """The OpenAI-shaped error body for `exc`."""
    kind = _ERROR_TYPES.get(exc.status, "server_error")
    param = getattr(exc, "param", None)
    return {"error": {"message": exc.message, "type": kind, "param": param, "code": exc.code}}


#: Whose conventions an error body follows: OpenAI's (the default, and /generate's),
#: Ollama's (`{"error": message}`, its routes) or Anthropic's (the Messages API).
ErrorShape = Literal["openai", "ollama", "anthropic"]

#: Anthropic's error types by status (its errors page); any other is `api_error`.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_error(exc: OrtServeError) -> dict[str, Any]:
    """The Anthropic-shaped error body (and stream event) for `exc`."""
    kind = _ANTHROPIC_TYPES.get(exc.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def error_body(exc: OrtServeError, shape: ErrorShape) -> dict[str, Any]:
    """The error body for `exc` in `shape`'s conventions."""
    if shape == "ollama":
        return {"error": exc.message}
    return anthropic_error(exc) if shape == "anthropic" else error_payload(exc)


def error_response(exc: OrtServeError, shape: ErrorShape = "openai") -> Response:
    """The HTTP response for an ortserve error (the one place errors become HTTP); the
    body in the conventions of the API it answers (`shape`: core.routes.error_shape)."""
    headers: list[tuple[str, str]] = []
    if isinstance(exc, BusyError):
        headers.append(("retry-after", str(int(exc.retry_after_s))))
    elif isinstance(exc, DrainingError) or (
        isinstance(exc, ModelUnavailableError) and exc.retryable
    ):
        headers.append(("retry-after", "5"))
    if isinstance(exc, MethodNotAllowedError):
        headers.append(("allow", ", ".join(exc.allowed)))
    return json_response(exc.status, error_body(exc, shape), headers)


def stream_error(exc: OrtServeError, shape: ErrorShape) -> bytes:
    """The last chunk of a stream an error cut, in its API's framing: an NDJSON line
    (Ollama), an `error` event (Anthropic), or an OpenAI-shaped SSE event."""
    if shape == "ollama":
        return ndjson_line(error_body(exc, shape))
    return sse_event(error_body(exc, shape), "error" if shape == "anthropic" else None)


NDJSON = "application/x-ndjson"


def ndjson_line(payload: Any) -> bytes:
    """One line of newline-delimited JSON (Ollama's streams)."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def ndjson_response(chunks: Iterator[bytes]) -> Response:
    """A streamed newline-delimited JSON response."""
    return Response(
        200,
        [("content-type", NDJSON), ("cache-control", "no-cache"), ("x-accel-buffering", "no")],
        chunks,
    )


def sse_event(payload: Any, name: str | None = None) -> bytes:
    """One server-sent event carrying `payload` as compact JSON, under the event `name`
    where the API names its events (Anthropic's)."""
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {name}\n" if name is not None else ""
    return f"{head}data: {data}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"

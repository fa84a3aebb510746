"""A core response as one buffered Lambda result, within Lambda's 6 MB response limit.

A streamed (SSE or NDJSON) response is collected whole. When the next event would push the result
past the limit, the generation is stopped and the body ends with an SSE error event, as
any error after the first byte does on every target; the client keeps what was
generated. A whole (non-streamed) body that is too large becomes a 413 error instead.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ortserve.core.errors import OrtServeError
from ortserve.core.http import (
    Response,
    error_payload,
    error_response,
    ndjson_line,
    sse_event,
)
from ortserve.functions.aws.errors import ResponseTooLargeError
from ortserve.functions.aws.events import Version, encoded_size, http_result

_ADVICE = "ask for fewer tokens, or use the streaming Function URL"


def _escaped_len(chunk: bytes) -> int:
    """Bytes `chunk` adds to the serialized result (JSON-escaped text, else base64)."""
    try:
        return len(json.dumps(chunk.decode("utf-8"))) - 2
    except UnicodeDecodeError:
        return 4 * math.ceil(len(chunk) / 3) + 4


def error_result(
    version: Version, exc: OrtServeError, request_id: str | None = None, ollama: bool = False
) -> dict[str, Any]:
    """`exc` as a whole error response in the event shape `version` (the body in Ollama's
    shape for a request to Ollama's routes: core.http decides, as for every error)."""
    error = error_response(exc, ollama)
    if request_id is not None:
        error.headers.append(("x-request-id", request_id))
    assert isinstance(error.body, bytes)  # error responses are whole
    return http_result(version, error.status, error.headers, error.body)


def _too_large(
    version: Version, response: Response, size: int, limit: int, ollama: bool
) -> dict[str, Any]:
    exc = ResponseTooLargeError(
        f"the response ({size} bytes) is larger than the {limit} bytes a buffered Lambda "
        f"response may carry: {_ADVICE}"
    )
    return error_result(version, exc, response.header("x-request-id"), ollama)


def _collect(response: Response, version: Version, limit: int, ollama: bool) -> dict[str, Any]:
    assert not isinstance(response.body, bytes)
    cut_error = ResponseTooLargeError(
        f"the stream was cut at the {limit} bytes a buffered Lambda response may carry: {_ADVICE}"
    )
    # The stream's own framing: SSE (OpenAI, /generate), or Ollama's NDJSON lines.
    if ollama:
        tail = ndjson_line({"error": cut_error.message})
    else:
        tail = sse_event(error_payload(cut_error))
    empty = http_result(version, response.status, response.headers, b"")
    budget = limit - encoded_size(empty) - _escaped_len(tail)
    chunks: list[bytes] = []
    used = 0
    cut = False
    try:
        for chunk in response.body:
            used += _escaped_len(chunk)
            if used > budget:
                cut = True
                break
            chunks.append(chunk)
    finally:
        response.close_body()  # a cut stream stops generating and frees its slot
    if cut:
        chunks.append(tail)
    return http_result(version, response.status, response.headers, b"".join(chunks))


def buffered_result(
    response: Response, version: Version, limit: int, ollama: bool = False
) -> dict[str, Any]:
    """The Lambda result for `response`, whose serialized size is at most `limit` bytes
    (`ollama`: it answers a request to Ollama's routes; see core.routes.ollama_shaped)."""
    if not isinstance(response.body, bytes):
        return _collect(response, version, limit, ollama)
    result = http_result(version, response.status, response.headers, response.body)
    size = encoded_size(result)
    return result if size <= limit else _too_large(version, response, size, limit, ollama)

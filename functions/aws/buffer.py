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
from ortserve.core.http import ErrorShape, Response, error_response, stream_error
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
    version: Version,
    exc: OrtServeError,
    request_id: str | None = None,
    shape: ErrorShape = "openai",
) -> dict[str, Any]:
    """`exc` as a whole error response in the event shape `version` (the body in the
    shape of the API the request was to: core.http decides, as for every error)."""
    error = error_response(exc, shape)
    if request_id is not None:
        error.headers.append(("x-request-id", request_id))
    assert isinstance(error.body, bytes)  # error responses are whole
    return http_result(version, error.status, error.headers, error.body)


def _too_large(
    version: Version, response: Response, size: int, limit: int, shape: ErrorShape
) -> dict[str, Any]:
    exc = ResponseTooLargeError(
        f"the response ({size} bytes) is larger than the {limit} bytes a buffered Lambda "
        f"response may carry: {_ADVICE}"
    )
    return error_result(version, exc, response.header("x-request-id"), shape)


def _collect(response: Response, version: Version, limit: int, shape: ErrorShape) -> dict[str, Any]:
    assert not isinstance(response.body, bytes)
    cut_error = ResponseTooLargeError(
        f"the stream was cut at the {limit} bytes a buffered Lambda response may carry: {_ADVICE}"
    )
    # The stream's own framing: SSE (OpenAI, /generate, Anthropic's named events), or
    # Ollama's NDJSON lines.
    tail = stream_error(cut_error, shape)
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
    response: Response, version: Version, limit: int, shape: ErrorShape = "openai"
) -> dict[str, Any]:
    """The Lambda result for `response`, whose serialized size is at most `limit` bytes
    (`shape`: the API the request was to; see core.routes.error_shape)."""
    if not isinstance(response.body, bytes):
        return _collect(response, version, limit, shape)
    result = http_result(version, response.status, response.headers, response.body)
    size = encoded_size(result)
    return result if size <= limit else _too_large(version, response, size, limit, shape)

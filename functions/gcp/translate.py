"""A flask request of functions-framework to `core.http.Request`.

Request bodies are read only up to the size limit (gunicorn would otherwise hand a 300 MB
body to `get_data` whole).
"""

from __future__ import annotations

import io

from flask import Request as FlaskRequest

from ortserve.core.http import Headers, Request

_READ_CHUNK = 64 * 1024


def core_request(request: FlaskRequest, max_body_bytes: int) -> Request:
    """`request` for the core, its body read now (at most `max_body_bytes` + 1 bytes).

    The WSGI server has already folded a repeated header into one value (gunicorn joins
    the values with `,`): WSGI keeps no header's values apart.
    """
    body = _read_body(request, max_body_bytes)
    return Request(request.method, _raw_path(request), Headers(request.headers.items()), body)


def _raw_path(request: FlaskRequest) -> str:
    """The path as the client sent it: werkzeug's `request.path` drops repeated leading
    slashes (`//v1/models` became `/v1/models`), which no other target does."""
    raw = str(request.environ.get("PATH_INFO") or "/")
    # WSGI carries the path's bytes as latin-1 text: back to bytes, then UTF-8.
    return raw.encode("latin-1", "replace").decode("utf-8", "replace")


def _read_body(request: FlaskRequest, limit: int) -> bytes:
    """The body; past `limit`, its first limit+1 bytes only, which is enough for the API
    to answer its own 413 (and log it) as on every target.

    A Content-Length over the limit is believed without reading a byte: the API refuses
    any body over the limit before a route sees it, so limit+1 placeholder bytes get the
    same answer.
    """
    declared = request.content_length
    if declared is not None and declared > limit:
        _leave_unread(request)
        return bytes(limit + 1)
    stream = request.stream  # chunked bodies too (gunicorn sets wsgi.input_terminated)
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        part = stream.read(min(_READ_CHUNK, limit + 1 - size))
        if not part:
            break
        parts.append(part)
        size += len(part)
    if size > limit:
        _leave_unread(request)
    return b"".join(parts)


def _leave_unread(request: FlaskRequest) -> None:
    """Hide the rest of an oversize body from functions-framework, whose `read_request`
    hook reads all of it after every buffered response (a 300 MB body held whole in
    memory); gunicorn discards what is left itself (gunicorn 27: at most 64 KiB or 5 s,
    then it closes the connection)."""
    request.stream = io.BytesIO()

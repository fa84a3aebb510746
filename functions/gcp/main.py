"""The HTTP function for functions-framework: a flask request in, core.http out.

The model loads once per instance at its cold start, with the EP probe, in the process
that serves requests. functions-framework imports this module in gunicorn's master and
then forks the worker: a model loaded before the fork would lose onnxruntime's threads
in the worker, and onnxruntime-genai 0.18 hangs at exit joining its telemetry thread.
So loading starts right after the fork, in the worker, in the background (`/readyz`
says "loading" meanwhile); without a fork (flask's debug server) the first request
starts it.

Request bodies are read only up to the size limit (gunicorn would otherwise hand a 300 MB
body to `get_data` whole); slow clients are gunicorn's and the platform's front end's
business (see the README on thread exhaustion).
"""

from __future__ import annotations

import io
import json
import os
import sys
from dataclasses import asdict

import functions_framework
from flask import Request as FlaskRequest
from flask import Response as FlaskResponse

from core.api import Api
from core.http import Request
from core.records import RequestRecord
from core.state import ModelState
from functions.gcp.settings import GcfSettings

_READ_CHUNK = 64 * 1024


def _log(record: RequestRecord) -> None:
    # Cloud Logging parses one JSON object per stdout line. One write per line: gunicorn's
    # threads log concurrently, and print() writes the text and the newline apart.
    sys.stdout.write(json.dumps({"severity": "INFO", **asdict(record)}) + "\n")
    sys.stdout.flush()


settings = GcfSettings()
state = ModelState(settings)
os.register_at_fork(after_in_child=state.start_loading)
api = Api(state, settings, on_record=_log)


@functions_framework.http
def ortserve(request: FlaskRequest) -> FlaskResponse:
    """Answer one HTTP request through the core API."""
    state.start_loading()  # a no-op once started
    # Read the body now: a streamed response is iterated after this function returns.
    body = _read_body(request, settings.max_body_bytes)
    core_request = Request(
        method=request.method,
        path=_raw_path(request),
        query={k: v[-1] for k, v in request.args.lists()},  # last value wins, as core says
        headers={k.lower(): v for k, v in request.headers.items()},
        body=body,
    )
    response = api.handle(core_request)
    return FlaskResponse(
        response.body, status=response.status, headers=response.headers,
        direct_passthrough=response.is_stream,
    )  # fmt: skip


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

"""The HTTP function for functions-framework: a flask request in, core.http out.

The model loads once per instance at its cold start, with the EP probe, in the process
that serves requests. functions-framework imports this module in gunicorn's master and
then forks the worker: a model loaded before the fork would lose onnxruntime's threads
in the worker, and onnxruntime-genai 0.18 hangs at exit joining its telemetry thread.
So loading starts right after the fork, in the worker, in the background (`/readyz`
says "loading" meanwhile); without a fork (flask's debug server) the first request
starts it.

The flask request becomes a `core.http.Request` in `functions.gcp.translate`; slow
clients are gunicorn's and the platform's front end's business (see docs/cloud-functions.md on
thread exhaustion).
"""

from __future__ import annotations

import os

import functions_framework
from flask import Request as FlaskRequest
from flask import Response as FlaskResponse

from ortserve.core.api import Api
from ortserve.core.logs import JsonLog
from ortserve.core.state import ModelState
from ortserve.functions.gcp.settings import GcfSettings
from ortserve.functions.gcp.translate import core_request

# Cloud Logging parses one JSON object per stdout line and reads its level from `severity`.
log = JsonLog(level_key="severity")
settings = GcfSettings()
state = ModelState(settings)
os.register_at_fork(after_in_child=state.start_loading)
api = Api(state, settings, on_record=log.record)


@functions_framework.http
def ortserve(request: FlaskRequest) -> FlaskResponse:
    """Answer one HTTP request through the core API."""
    state.start_loading()  # a no-op once started
    # Read the body now: a streamed response is iterated after this function returns.
    response = api.handle(core_request(request, settings.max_body_bytes))
    return FlaskResponse(
        response.body,
        status=response.status,
        headers=response.headers,
        direct_passthrough=response.is_stream,
    )

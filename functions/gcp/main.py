"""The HTTP function for functions-framework: a flask request in, core.http out.

The model loads once per instance at its cold start, with the EP probe, in the process
that serves requests. functions-framework imports this module in gunicorn's master and
then forks the worker: a model loaded before the fork would lose onnxruntime's threads
in the worker, and onnxruntime-genai 0.18 hangs at exit joining its telemetry thread.
So loading starts right after the fork, in the worker, in the background (`/readyz`
says "loading" meanwhile); without a fork (flask's debug server) the first request
starts it.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

import functions_framework
from flask import Request as FlaskRequest
from flask import Response as FlaskResponse

from core.api import Api, RequestRecord
from core.http import Request
from core.service import ModelState
from functions.gcp.settings import GcfSettings


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
    body = request.get_data(cache=False)
    core_request = Request(
        method=request.method,
        path=request.path,
        query={k: v[-1] for k, v in request.args.lists()},  # last value wins, as core says
        headers={k.lower(): v for k, v in request.headers.items()},
        body=body,
    )
    response = api.handle(core_request)
    return FlaskResponse(
        response.body, status=response.status, headers=response.headers,
        direct_passthrough=response.is_stream,
    )  # fmt: skip

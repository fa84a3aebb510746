"""The image's real entry point: `python -m awslambdaric ortserve.functions.aws.handler.handler`.

The real runtime interface client runs the handler from the Lambda bake output (the
image's /var/task) against a loopback fake of the Lambda Runtime API, as Lambda would.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.support.lambda_events import v2_event
from benchmarks.support.lambda_runtime_api import FakeRuntimeApi, running
from benchmarks.support.servers import ServerProcess
from tests.functional.harness import API_KEY
from tests.functional.lambda_target import decode_result, make_lambda_bundle

HANDLER = "ortserve.functions.aws.handler.handler"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundle(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_lambda_bundle(tiny_model_dir, tmp_path_factory.mktemp("lambda"))


def _env(api: FakeRuntimeApi, bundle: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORTSERVE_", "AWS_"))}
    env.update(
        AWS_LAMBDA_RUNTIME_API=api.address,
        AWS_LAMBDA_FUNCTION_NAME="ortserve",
        AWS_LAMBDA_FUNCTION_MEMORY_SIZE="3008",
        AWS_LAMBDA_INITIALIZATION_TYPE="on-demand",
        LAMBDA_TASK_ROOT=str(bundle),
        PYTHONPATH=str(bundle),  # the image's /var/task: the code under test is the bundle's
        ORTSERVE_PROVIDERS="cpu",
        ORTSERVE_API_KEYS=API_KEY,
        **extra,
    )
    return env


def _runtime(api: FakeRuntimeApi, bundle: Path, **extra: str) -> ServerProcess:
    """The runtime client process, its output kept; stopped with SIGTERM, as Lambda does
    (a client blocked in `next` ignores SIGINT, not SIGTERM)."""
    cmd = [sys.executable, "-m", "awslambdaric", HANDLER]
    return ServerProcess(cmd, _env(api, bundle, **extra), cwd=bundle)


def _log_lines(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_invokes_through_the_real_runtime_client(bundle: Path) -> None:
    body = json.dumps({"prompt": "Hello", "max_new_tokens": 8, "temperature": 0}).encode()
    event = v2_event(
        "POST",
        "/generate",
        {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"},
        body,
    )
    with running() as api, _runtime(api, bundle) as client:
        first = api.invoke(event)
        assert first.kind == "response", first.body
        reply = decode_result(first.json())
        assert reply.status == 200 and reply.json()["tokens_generated"] > 0

        # A payload the runtime cannot even decode fails this invoke only ...
        broken = api.invoke(b"{not json")
        assert broken.kind == "error"
        assert broken.json()["errorType"] == "Runtime.UnmarshalError"
        # ... and the environment goes on serving, model still loaded.
        again = decode_result(api.invoke(event).json())
        assert again.status == 200 and again.json() == reply.json()  # greedy: the same text
        unauthorized = decode_result(api.invoke({**event, "headers": {}}).json())
        assert unauthorized.status == 401
        lines = _log_lines(client.stdout())
        assert client.proc.poll() is None
    cold = [line for line in lines if line["message"] == "cold start"]
    assert len(cold) == 1 and cold[0]["status"] == "ready" and cold[0]["load_phase"] == "init"
    assert cold[0]["threads"] == 2 and cold[0]["memory_mb"] == 3008
    assert "process_age_at_init_end_s" in cold[0]
    requests = [line for line in lines if line["message"] == "request"]
    assert [r["status"] for r in requests] == [200, 200, 401]
    assert all(r["aws_request_id"] for r in requests)


def test_an_init_failure_is_reported_to_the_runtime_api(bundle: Path) -> None:
    bad = {"ORTSERVE_LAMBDA_LOAD_AT_INIT": "sometimes"}  # a deployment mistake
    with running() as api, _runtime(api, bundle, **bad) as client:
        error = api.init_errors.get(timeout=60)
        assert client.proc.wait(30) == 1  # the client gives up; Lambda will start a new one
    document = error.json()
    assert document["errorType"] == "ValidationError"
    assert "lambda_load_at_init" in document["errorMessage"]
    assert error.headers.get("lambda-runtime-function-error-type")

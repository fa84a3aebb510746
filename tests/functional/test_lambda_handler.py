"""The buffered Lambda handler with the tiny model: recorded events, errors, limits, cold start."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.support.lambda_events import v2_event
from ortserve.core.api import Api
from ortserve.core.settings import ServerSettings
from ortserve.core.state import ModelState
from ortserve.functions.aws.events import encoded_size, parse_event
from ortserve.functions.aws.runtime import LambdaApp
from tests.functional.harness import API_KEY, InProcess, normalized
from tests.functional.lambda_target import FakeContext, LambdaTarget, decode_result, lambda_app

EVENTS = Path(__file__).resolve().parents[1] / "events"
ROOT = Path(__file__).resolve().parents[2]
GREEDY = {"max_new_tokens": 24, "temperature": 0}


def _event(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((EVENTS / name).read_text(encoding="utf-8"))
    return data


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def app(tiny_model_dir: Path) -> LambdaApp:
    return lambda_app(tiny_model_dir)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> InProcess:
    settings = ServerSettings(
        model_dir=tiny_model_dir,
        providers="cpu",
        api_keys=[API_KEY],
        max_body_bytes=64 * 1024,
        max_new_tokens=2000,
    )
    state = ModelState(settings)
    state.load()
    return InProcess(Api(state, settings))


# -- recorded events ---------------------------------------------------------------------


def test_http_api_event(app: LambdaApp) -> None:
    result = app.handle(_event("http-api-generate.json"), FakeContext())
    assert set(result) == {"statusCode", "headers", "body", "isBase64Encoded"}  # 2.0 shape
    reply = decode_result(result)
    assert reply.status == 200
    assert set(reply.json()) == {
        "generated_text",
        "tokens_generated",
        "prompt_tokens",
        "finish_reason",
    }
    assert reply.headers["content-type"] == "application/json"


def test_base64_body_cookies_and_stage(app: LambdaApp) -> None:
    reply = decode_result(app.handle(_event("http-api-base64-cookies-stage.json"), FakeContext()))
    assert reply.status == 200
    assert reply.json()["object"] == "text_completion"


def test_function_url_stream_comes_back_whole(app: LambdaApp) -> None:
    event = _event("function-url-chat-stream.json")
    reply = decode_result(app.handle(event, FakeContext()))
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = reply.events()
    assert events[-1] == "[DONE]"
    assert events[-2]["usage"]["completion_tokens"] > 0
    whole = json.loads(event["body"]) | {"stream": False}
    same = decode_result(app.handle({**event, "body": json.dumps(whole)}, FakeContext())).json()
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"])
    assert text == same["choices"][0]["message"]["content"]


def test_rest_event_gets_a_rest_shaped_result(app: LambdaApp) -> None:
    result = app.handle(_event("rest-completions-multivalue.json"), FakeContext())
    assert result["statusCode"] == 200
    assert result["multiValueHeaders"]["content-type"] == ["application/json"]
    assert json.loads(result["body"])["choices"][0]["finish_reason"] in {"stop", "length"}
    ready = app.handle(_event("rest-readyz.json"), FakeContext())
    assert ready["statusCode"] == 200 and json.loads(ready["body"])["status"] == "ready"


@pytest.mark.parametrize(
    ("name", "status", "code"),
    [
        ("function-url-models-no-key.json", 401, "invalid_api_key"),
        ("http-api-bad-json.json", 400, "invalid_request"),
        ("s3-put-not-http.json", 400, "invalid_request"),
    ],
)
def test_errors_in_the_events_shape(app: LambdaApp, name: str, status: int, code: str) -> None:
    result = app.handle(_event(name), FakeContext())
    assert set(result) == {"statusCode", "headers", "body", "isBase64Encoded"}
    reply = decode_result(result)
    assert reply.status == status
    error = reply.json()["error"]
    assert error["code"] == code and error["message"]
    assert "Traceback" not in reply.body.decode()


def test_lone_surrogates_in_the_event_are_a_400(app: LambdaApp) -> None:
    """JSON allows "\\ud800"; the runtime hands it over as a str that is not Unicode."""
    event = _event("http-api-generate.json")
    for changed in (
        {**event, "body": '{"prompt": "a\ud800b"}', "isBase64Encoded": False},
        {**event, "rawPath": "/gen\ud800erate"},
    ):
        reply = decode_result(app.handle(changed, FakeContext()))
        assert reply.status == 400, reply.body
        assert reply.json()["error"]["code"] == "invalid_request"


def test_a_rest_error_is_rest_shaped(app: LambdaApp) -> None:
    event = _event("rest-completions-multivalue.json")
    event["multiValueHeaders"]["X-Api-Key"] = ["wrong"]
    result = app.handle(event, FakeContext())
    assert result["statusCode"] == 401 and "multiValueHeaders" in result


# -- parity through every event shape ----------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "base64_body"), [("http-api", False), ("function-url", True), ("rest", False)]
)
def test_same_bytes_as_the_core(
    app: LambdaApp, reference: InProcess, shape: Any, base64_body: bool
) -> None:
    target = LambdaTarget(app.handle, shape, base64_body)
    requests = [
        ("/generate", {"prompt": "Parity", **GREEDY, "stream": True}),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "P"}],
                "max_tokens": 10,
                "temperature": 0,
                "stream": True,
            },
        ),
        ("/v1/completions", {"prompt": "Parity", "max_tokens": 10, "temperature": 0}),
        (
            "/v1/messages",
            {
                "messages": [{"role": "user", "content": "P"}],
                "max_tokens": 10,
                "temperature": 0,
                "stream": True,
            },
        ),
    ]
    for path, body in requests:
        got, want = target.call("POST", path, body), reference.call("POST", path, body)
        assert got.status == want.status == 200
        assert normalized(got.body) == normalized(want.body), path
        assert got.headers["content-type"] == want.headers["content-type"]
    with pytest.raises(NotImplementedError, match="RESPONSE_STREAM"):
        target.open_stream("/generate", {"prompt": "x"})


# -- the 6 MB limit ----------------------------------------------------------------------


def test_a_too_large_stream_is_cut_and_the_generation_stopped(tiny_model_dir: Path) -> None:
    app = lambda_app(tiny_model_dir, lambda_max_response_bytes=4096)
    target = LambdaTarget(app.handle)
    body = {"prompt": "Hello", "max_new_tokens": 2000, "temperature": 0, "stream": True}
    event = target.event(
        "POST", "/generate", {"authorization": f"Bearer {API_KEY}"}, json.dumps(body).encode()
    )
    result = app.handle(event, FakeContext())
    assert encoded_size(result) <= 4096
    reply = decode_result(result)
    assert reply.status == 200
    events = reply.events()
    assert events[0]["text"] is not None
    assert events[-1]["error"]["code"] == "response_too_large"
    health = target.call("GET", "/healthz").json()
    assert health["active"] == 0 and app.api.in_flight == 0
    # A whole body: the random model often ends early, so sample until one is too large.
    for seed in range(40):
        whole = target.call(
            "POST", "/generate", {**body, "stream": False, "temperature": 1.0, "seed": seed}
        )
        if whole.status != 200:
            break
        assert len(whole.body) < 4096
    assert whole.status == 413
    assert whole.json()["error"]["code"] == "response_too_large"


def test_a_too_large_anthropic_stream_ends_with_its_error_event(tiny_model_dir: Path) -> None:
    """The Messages API's stream, cut at the limit, ends as Anthropic's streams end on an
    error: an `error` event in its shape (not OpenAI's)."""
    app = lambda_app(tiny_model_dir, lambda_max_response_bytes=4096)
    target = LambdaTarget(app.handle)
    body = {
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 2000,
        "temperature": 0,
        "stream": True,
    }
    reply = target.call("POST", "/v1/messages", body)
    assert reply.status == 200
    blocks = [b for b in reply.body.decode().split("\n\n") if b.strip()]
    assert blocks[0].startswith("event: message_start\n")
    name, data = blocks[-1].split("\n")
    assert name == "event: error"
    assert json.loads(data.removeprefix("data: "))["error"]["type"] == "request_too_large"


# -- cold start --------------------------------------------------------------------------


def test_cold_start_figures_in_one_line(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = lambda_app(tiny_model_dir)
    lines = _lines(capsys.readouterr().out)
    assert [line["message"] for line in lines] == ["cold start"]
    figures = lines[0]
    assert figures["status"] == "ready" and figures["load_phase"] == "init"
    assert figures["execution_provider"] == "cpu" and figures["threads"] >= 1
    assert figures["load_seconds"] > 0 and figures["init_s"] >= figures["load_seconds"]
    assert figures["model_source"] == "image"
    assert "within the 8 s budget" in figures["load_plan"]
    # The log says what /readyz says of the model (same names, same values).
    # A load balancer's probe (no key) gets the status only; a key gets the model.
    probe = _event("rest-readyz.json")
    assert json.loads(app.handle(probe)["body"]) == {"status": "ready"}
    probe["headers"]["x-api-key"] = API_KEY
    probe["multiValueHeaders"]["x-api-key"] = [API_KEY]
    ready = json.loads(app.handle(probe)["body"])
    for key in ("model", "manifest_digest", "execution_provider", "skipped_providers"):
        assert figures[key] == ready[key]
    capsys.readouterr()
    app.handle(_event("http-api-generate.json"), FakeContext(aws_request_id="req-1"))
    (record,) = _lines(capsys.readouterr().out)
    assert record["message"] == "request" and record["aws_request_id"] == "req-1"
    assert record["route"] == "/generate" and record["status"] == 200
    assert record["completion_tokens"] > 0


def test_a_deferred_load_happens_on_the_first_invoke(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = lambda_app(tiny_model_dir, lambda_load_at_init="never")
    (deferred,) = _lines(capsys.readouterr().out)
    assert deferred["message"] == "model load deferred to the first invoke"
    assert deferred["load_plan"] == "ORTSERVE_LAMBDA_LOAD_AT_INIT=never"
    target = LambdaTarget(app.handle)
    assert target.call("GET", "/healthz").json()["status"] == "loading"  # no load for liveness
    assert target.call("POST", "/generate", {"prompt": "Hi", **GREEDY}).status == 200
    (cold,) = [line for line in _lines(capsys.readouterr().out) if line["message"] != "request"]
    assert cold["message"] == "cold start" and cold["load_phase"] == "first_invoke"
    assert cold["status"] == "ready" and cold["setup_s"] > 0
    # the first invoke waits for the load, not for a warm-up generation too
    assert cold["warmup"] == "skipped: the load is on the first invoke"
    assert cold["warmup_seconds"] is None


def test_a_warm_up_the_operator_asks_for_runs_on_the_first_invoke_too(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = lambda_app(tiny_model_dir, lambda_load_at_init="never", warmup=True)
    assert (
        LambdaTarget(app.handle).call("POST", "/generate", {"prompt": "Hi", **GREEDY}).status == 200
    )
    (cold,) = [line for line in _lines(capsys.readouterr().out) if line["message"] == "cold start"]
    assert cold["load_phase"] == "first_invoke" and cold["warmup_seconds"] > 0
    assert "warmup" not in cold


def test_a_missing_model_answers_503_then_recovers(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    app = lambda_app(model, lambda_retry_failed_s=0)
    target = LambdaTarget(app.handle)
    ready = target.call("GET", "/readyz")
    assert ready.status == 503 and "does not exist" in ready.json()["reason"]
    assert target.call("POST", "/generate", {"prompt": "x"}).status == 503
    cold = _lines(capsys.readouterr().out)[0]
    assert cold["message"] == "cold start" and cold["status"] == "failed"
    shutil.copytree(tiny_model_dir, model)  # e.g. a transient error has gone
    assert target.call("POST", "/generate", {"prompt": "x", **GREEDY}).status == 200
    assert "cold start retried" in capsys.readouterr().out


def test_the_handler_module_imports_no_web_framework_and_no_boto3(tiny_model_dir: Path) -> None:
    """Lambda's real entry point, imported as the runtime does: lean, loaded at import."""
    code = (
        "import json, sys; import ortserve.functions.aws.handler as h; "
        "mods = ('boto3', 'botocore', 'flask', 'werkzeug', 'starlette', 'uvicorn'); "
        "print(json.dumps({'loaded': sorted(m for m in mods if m in sys.modules), "
        "'status': h.app.state.status}))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORTSERVE_", "AWS_"))}
    env.update(
        ORTSERVE_MODEL_DIR=str(tiny_model_dir), ORTSERVE_PROVIDERS="cpu", ORTSERVE_API_KEYS=API_KEY
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    *logs, last = _lines(proc.stdout)
    assert json.loads(json.dumps(last)) == {"loaded": [], "status": "ready"}
    assert logs[0]["message"] == "cold start"


# -- not open by default -----------------------------------------------------------------


def test_no_api_key_refuses_to_serve_unless_opted_out(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    closed = LambdaTarget(lambda_app(tiny_model_dir, api_keys=[]).handle)
    (cold,) = _lines(capsys.readouterr().out)[-1:]
    assert cold["message"] == "cold start" and cold["status"] == "failed"
    ready = closed.call("GET", "/readyz")
    assert ready.status == 503 and ready.json()["reason"].startswith("no API key is configured")
    assert "AllowUnauthenticated=true" in ready.json()["reason"]
    assert (
        closed.call("POST", "/generate", {"prompt": "x", **GREEDY}, {"authorization": ""}).status
        == 503
    )
    open_ = LambdaTarget(lambda_app(tiny_model_dir, api_keys=[], allow_unauthenticated=True).handle)
    assert (
        open_.call("POST", "/generate", {"prompt": "x", **GREEDY}, {"authorization": ""}).status
        == 200
    )


# -- deadlines that agree with the platform's ----------------------------------------------


class ShortContext(FakeContext):
    def __init__(self, remaining_ms: int) -> None:
        super().__init__()
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def test_the_deadline_comes_from_the_invoke_and_the_api(app: LambdaApp) -> None:
    body = json.dumps({"prompt": "x"}).encode()
    url = parse_event(v2_event("POST", "/generate", {}, body, function_url=True))
    api = parse_event(v2_event("POST", "/generate", {}, body))
    assert url.function_url and not api.function_url
    margin = app.settings.lambda_deadline_margin_s
    assert margin == 2.0 and app.settings.lambda_api_gateway_timeout_s == 30.0
    # A Function URL waits for the function: its remaining time, less the margin.
    assert app.deadline(url, ShortContext(600_000), 100.0) == 100.0 + 600 - margin
    # API Gateway cuts at 30 s whatever the function's timeout.
    assert app.deadline(api, ShortContext(600_000), 100.0) == 100.0 + 30 - margin
    assert app.deadline(api, ShortContext(10_000), 100.0) == 100.0 + 10 - margin
    assert app.deadline(url, None, 100.0) is None  # no Lambda context: only the setting


@pytest.mark.parametrize("shape", ["function-url", "http-api"])
def test_a_generation_past_the_invoke_deadline_ends_with_a_readable_504(
    app: LambdaApp, shape: str
) -> None:
    target = LambdaTarget(app.handle, shape)  # type: ignore[arg-type]
    body = json.dumps({"prompt": "Hello", "max_new_tokens": 64}).encode()
    headers = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    event = target.event("POST", "/generate", headers, body)
    # 2 s left: the margin is used up, so the generation ends before Lambda would kill it.
    late = decode_result(app.handle(event, ShortContext(2_000)))
    assert late.status == 504
    assert "platform's time limit" in late.json()["error"]["message"]
    assert decode_result(app.handle(event, ShortContext(60_000))).status == 200

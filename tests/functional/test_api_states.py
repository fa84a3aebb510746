"""The API when the model is missing, the server is busy or draining, or a stream fails."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from ortserve.core.api import Api
from ortserve.core.engine import Engine
from ortserve.core.http import Request
from ortserve.core.records import RequestRecord
from ortserve.core.settings import ServerSettings
from ortserve.core.state import ModelState
from tests.functional.harness import InProcess


def _api(model_dir: Path, **kw: object) -> Api:
    settings = ServerSettings(model_dir=model_dir, providers="cpu", **kw)  # type: ignore[arg-type]
    state = ModelState(settings)
    state.load()
    return Api(state, settings)


def test_missing_model_keeps_serving_health_and_says_why(tmp_path: Path) -> None:
    client = InProcess(_api(tmp_path / "nowhere"))
    ready = client.call("GET", "/readyz")
    assert ready.status == 503
    assert ready.json()["status"] == "failed"
    assert "does not exist" in ready.json()["reason"]
    # A failed load does not come back by waiting: no Retry-After (loading has one).
    assert "retry-after" not in ready.headers
    assert client.call("GET", "/healthz").status == 200
    reply = client.call("POST", "/generate", {"prompt": "x"})
    assert reply.status == 503
    assert reply.json()["error"]["code"] == "model_unavailable"
    assert "does not exist" in reply.json()["error"]["message"]
    assert "retry-after" not in reply.headers


@pytest.mark.parametrize("max_batch", [1, 4])
def test_busy_is_503_with_retry_after(tiny_model_dir: Path, max_batch: int) -> None:
    # One generation at a time: with batching, that is a batch of up to `max_batch`.
    api = _api(tiny_model_dir, max_concurrency=1, max_queue=0, max_batch=max_batch)
    client = InProcess(api)
    held = []
    for _ in range(max_batch):
        reply = api.handle(
            Request(
                "POST",
                "/generate",
                body=json.dumps({"prompt": "x", "max_new_tokens": 50, "stream": True}).encode(),
            )
        )
        assert not isinstance(reply.body, bytes)
        next(reply.body)
        held.append(reply)
    for body in ({"prompt": "y", "max_tokens": 2}, {"prompt": "y", "max_tokens": 2, "seed": 1}):
        busy = client.call("POST", "/v1/completions", body)
        assert busy.status == 503
        assert busy.json()["error"]["code"] == "busy"
        assert int(busy.headers["retry-after"]) >= 1
    if max_batch > 1:  # a seeded request needs the whole generation: one batched is too many
        held.pop().close_body()
        seeded = client.call("POST", "/v1/completions", {"prompt": "y", "max_tokens": 2, "seed": 1})
        assert seeded.status == 503
    for reply in held:
        reply.close_body()
    assert api.state.service is not None and api.state.service.stats().active == 0
    assert api.in_flight == 0
    assert client.call("POST", "/v1/completions", {"prompt": "y", "max_tokens": 2}).status == 200


def test_an_error_after_the_first_byte_is_a_final_sse_event(tiny_model_dir: Path) -> None:
    api = _api(tiny_model_dir, request_timeout_s=1e-9)
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 40, "stream": True}
    reply = InProcess(api).call("POST", "/v1/chat/completions", body)
    assert reply.status == 200
    events = reply.events()
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1]["error"]["code"] == "timeout"
    assert "[DONE]" not in events
    assert api.state.service is not None and api.state.service.stats().active == 0
    buffered = InProcess(api).call("POST", "/generate", {"prompt": "x", "max_new_tokens": 40})
    assert buffered.status == 504


def test_a_platform_deadline_ends_a_generation_with_an_error_it_can_send(
    tiny_model_dir: Path,
) -> None:
    """An adapter's deadline (e.g. a Lambda invoke's remaining time) ends the generation
    with a 504 the client can read, before the platform kills it without one."""
    import time

    api = _api(tiny_model_dir)
    body = json.dumps({"prompt": "x", "max_new_tokens": 40}).encode()
    late = Request("POST", "/generate", body=body, deadline=time.monotonic())
    reply = api.handle(late)
    assert reply.status == 504
    assert "platform's time limit" in json.loads(reply.body)["error"]["message"]  # type: ignore[arg-type]
    later = Request("POST", "/generate", body=body, deadline=time.monotonic() + 60)
    assert api.handle(later).status == 200


def test_draining_refuses_new_generations_but_not_health(tiny_model_dir: Path) -> None:
    api = _api(tiny_model_dir)
    api.start_draining()
    client = InProcess(api)
    reply = client.call("POST", "/generate", {"prompt": "x"})
    assert reply.status == 503
    assert reply.json()["error"]["code"] == "shutting_down"
    assert client.call("GET", "/readyz").json()["status"] == "draining"
    assert client.call("GET", "/healthz").status == 200


def test_records_carry_counts(tiny_model_dir: Path) -> None:
    records: list[RequestRecord] = []
    settings = ServerSettings(model_dir=tiny_model_dir, providers="cpu")
    state = ModelState(settings)
    state.load()
    api = Api(state, settings, on_record=records.append)
    client = InProcess(api)
    client.call(
        "POST",
        "/generate",
        {"prompt": "x", "max_new_tokens": 5, "stream": True},
        headers={"x-request-id": "abc-123"},
    )
    client.call("GET", "/nope")
    client.call("POST", "/generate", {"prompt": "x", "max_new_tokens": -1})
    first, second, third = records
    assert first.request_id == "abc-123"
    assert (first.route, first.status, first.completion_tokens) == ("/generate", 200, 5)
    assert first.prompt_tokens > 0 and first.duration_s > 0 and first.reason == ""
    assert (second.status, second.completion_tokens) == (404, 0)
    # A refusal says why in its record (#27 item 10), as its answer told the client.
    assert second.reason == "not_found: no route /nope"
    assert third.status == 400 and third.reason.startswith("invalid_request: max_new_tokens: ")


def test_records_of_a_model_that_is_not_there_say_why(tmp_path: Path) -> None:
    records: list[RequestRecord] = []
    settings = ServerSettings(model_dir=tmp_path / "nowhere", providers="cpu")
    state = ModelState(settings)
    state.load()
    client = InProcess(Api(state, settings, on_record=records.append))
    client.call("GET", "/readyz")
    client.call("POST", "/generate", {"prompt": "x"})
    ready, generate = records
    assert ready.status == 503 and ready.reason.startswith("not ready: failed ("), ready
    assert "does not exist" in ready.reason
    assert generate.status == 503 and generate.reason.startswith("model_unavailable: the model ")


def test_start_loading_answers_at_once_while_a_load_runs(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cloud Functions calls start_loading on every request, health checks included.
    entered, release = threading.Event(), threading.Event()
    real = Engine.load.__func__  # type: ignore[attr-defined]

    def slow(cls: type[Engine], settings: ServerSettings) -> Engine:
        entered.set()
        release.wait(30)
        return real(cls, settings)  # type: ignore[no-any-return]

    monkeypatch.setattr(Engine, "load", classmethod(slow))
    state = ModelState(ServerSettings(model_dir=tiny_model_dir, providers="cpu"))
    loader = state.start_loading()
    assert entered.wait(10)
    again = threading.Thread(target=state.start_loading)
    again.start()
    again.join(5)
    assert not again.is_alive() and state.status == "loading"
    release.set()
    loader.join(60)
    assert state.engine is not None and state.reason is None


def test_requests_during_a_cold_load_wait_for_it(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that reaches a cold instance is answered once the model is in (as
    Ollama's are), within QUEUE_TIMEOUT_S; past it, 503 with Retry-After; health answers
    at once, and a client that leaves stops waiting."""
    release = threading.Event()
    real = Engine.load.__func__  # type: ignore[attr-defined]

    def slow(cls: type[Engine], settings: ServerSettings) -> Engine:
        release.wait(30)
        return real(cls, settings)  # type: ignore[no-any-return]

    monkeypatch.setattr(Engine, "load", classmethod(slow))
    settings = ServerSettings(model_dir=tiny_model_dir, providers="cpu", queue_timeout_s=0.3)
    state = ModelState(settings)
    client = InProcess(Api(state, settings))
    loader = state.start_loading()
    body = {"prompt": "x", "max_new_tokens": 2}
    late = client.call("POST", "/generate", body)  # the load outlasts QUEUE_TIMEOUT_S
    assert late.status == 503 and late.json()["error"]["code"] == "model_unavailable"
    assert late.headers["retry-after"]
    assert client.call("GET", "/readyz").json()["status"] == "loading"
    gone = Request("POST", "/generate", body=json.dumps(body).encode())
    gone.cancelled.set()
    assert client.api.handle(gone).status == 499
    settings.queue_timeout_s = 30.0
    replies: list[int] = []
    waiting = [
        threading.Thread(
            target=lambda: replies.append(client.call("POST", "/generate", body).status)
        )
        for _ in range(3)
    ]
    for thread in waiting:
        thread.start()
    release.set()
    for thread in waiting:
        thread.join(60)
    loader.join(60)
    assert replies == [200, 200, 200]


def test_the_model_warms_up_before_it_is_ready(tiny_model_dir: Path) -> None:
    """One short generation runs between the load and "ready" (ORTSERVE_WARMUP, on by
    default); /readyz says how long it took; it takes no slot and counts no batch."""
    warm = InProcess(_api(tiny_model_dir)).call("GET", "/readyz").json()
    assert warm["status"] == "ready" and warm["warmup_seconds"] > 0
    assert (warm["active"], warm["waiting"]) == (0, 0)
    cold = InProcess(_api(tiny_model_dir, warmup=False)).call("GET", "/readyz").json()
    assert cold["status"] == "ready" and cold["warmup_seconds"] is None


def test_a_prompt_over_the_servers_token_limit_is_a_400(tiny_model_dir: Path) -> None:
    client = InProcess(_api(tiny_model_dir, max_prompt_tokens=4))
    assert client.call("POST", "/generate", {"prompt": "Hi", "max_new_tokens": 2}).status == 200
    long = client.call("POST", "/generate", {"prompt": "hello world " * 10, "max_new_tokens": 2})
    assert long.status == 400
    assert "this server's limit is 4" in long.json()["error"]["message"]
    chat = client.call(
        "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hello " * 10}]}
    )
    assert chat.status == 400


def test_a_request_id_is_echoed_only_when_it_is_safe(tiny_model_dir: Path) -> None:
    client = InProcess(_api(tiny_model_dir))
    assert (
        client.call("GET", "/healthz", headers={"x-request-id": "ab-1.c_d"}).headers["x-request-id"]
        == "ab-1.c_d"
    )
    for unsafe in ("abc\n", "a b", "x" * 65):
        echoed = client.call("GET", "/healthz", headers={"x-request-id": unsafe})
        assert len(echoed.headers["x-request-id"]) == 32, unsafe  # a fresh id instead


def test_cors_is_off_by_default_and_configurable(tiny_model_dir: Path) -> None:
    origin = {"origin": "https://app.example"}
    closed = InProcess(_api(tiny_model_dir))
    assert (
        "access-control-allow-origin"
        not in closed.call("GET", "/v1/models", headers=origin).headers
    )
    opened = InProcess(_api(tiny_model_dir, cors_origins="https://app.example/, https://b.example"))
    reply = opened.call("GET", "/v1/models", headers=origin)
    assert reply.headers["access-control-allow-origin"] == "https://app.example"
    asking = {**origin, "access-control-request-method": "POST"}
    preflight = opened.call("OPTIONS", "/v1/chat/completions", headers=asking)
    assert preflight.status == 204
    assert "authorization" in preflight.headers["access-control-allow-headers"]
    assert "POST" in preflight.headers["access-control-allow-methods"]
    other = opened.call("GET", "/v1/models", headers={"origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers

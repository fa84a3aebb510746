"""Each generation's record says how its answer ended (`RequestRecord.ending`, counted in
/metrics as `ortserve_answers_total` and watched by the usable-answer alert, #26 item 13):
stop, length, tool_calls, cancelled (the client left), error (a timeout); none for
requests that never generated."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortserve.core.api import Api
from ortserve.core.records import RequestRecord
from ortserve.core.settings import ServerSettings
from ortserve.core.state import ModelState
from tests.functional.harness import API_KEY, InProcess

MODEL = "ortserve/tiny-llama-random-weights"
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string", "maxLength": 6}},
            "required": ["q"],
        },
    },
}


def _api(model_dir: Path, records: list[RequestRecord], **kw: object) -> InProcess:
    settings = ServerSettings(model_dir=model_dir, providers="cpu", api_keys=[API_KEY], **kw)  # type: ignore[arg-type]
    state = ModelState(settings)
    state.load()
    assert state.status == "ready", state.reason
    return InProcess(Api(state, settings, on_record=records.append))


@pytest.fixture(scope="module")
def records() -> list[RequestRecord]:
    return []


@pytest.fixture(scope="module")
def api(tiny_model_dir: Path, records: list[RequestRecord]) -> InProcess:
    return _api(tiny_model_dir, records)


def _ending(records: list[RequestRecord]) -> str:
    return records[-1].ending


def test_stop_length_and_tool_calls(api: InProcess, records: list[RequestRecord]) -> None:
    ask = [{"role": "user", "content": "Look it up"}]
    api.call("POST", "/v1/chat/completions", {"messages": ask, "max_tokens": 4})
    assert _ending(records) == "length"
    api.call("POST", "/generate", {"prompt": "Hi", "guided_regex": "ok", "max_new_tokens": 9})
    assert _ending(records) == "stop"
    body = {"messages": ask, "tools": [TOOL], "tool_choice": "required", "max_tokens": 40}
    reply = api.call("POST", "/v1/chat/completions", body)
    assert reply.json()["choices"][0]["finish_reason"] == "tool_calls"
    assert _ending(records) == "tool_calls"
    api.call("POST", "/v1/chat/completions", {**body, "stream": True})
    assert _ending(records) == "tool_calls"
    assert api.call("GET", "/healthz").status == 200
    assert _ending(records) == ""  # not a generation
    assert api.call("POST", "/v1/chat/completions", {"messages": []}).status == 400
    assert _ending(records) == ""  # refused before any token


def test_ollama_tool_calls_and_load_requests(api: InProcess, records: list[RequestRecord]) -> None:
    """Ollama's chat: a call ends as `tool_calls` (whole or streamed), as on OpenAI's route;
    a load request generates nothing (#26 item 9)."""
    call = {
        "type": "object",
        "properties": {"name": {"const": "lookup"}, "arguments": TOOL["function"]["parameters"]},  # type: ignore[index]
        "required": ["name", "arguments"],
    }
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Look it up"}],
        "tools": [TOOL],
        "format": call,
        "options": {"num_predict": 80, "seed": 1},
    }
    reply = api.call("POST", "/api/chat", {**body, "stream": False})
    assert reply.json()["message"]["tool_calls"]
    assert _ending(records) == "tool_calls"
    api.call("POST", "/api/chat", body)
    assert _ending(records) == "tool_calls"
    assert api.call("POST", "/api/generate", {"model": MODEL}).json()["done_reason"] == "load"
    assert _ending(records) == ""


def test_a_client_that_leaves_is_cancelled(api: InProcess, records: list[RequestRecord]) -> None:
    body = {"prompt": "Hi", "max_new_tokens": 200, "ignore_eos": True, "stream": True}
    with api.open_stream("/generate", body) as chunks:
        next(chunks)
    assert _ending(records) == "cancelled"


def test_a_timeout_is_an_error(tiny_model_dir: Path) -> None:
    records: list[RequestRecord] = []
    api = _api(tiny_model_dir, records, request_timeout_s=0.005, warmup=False)
    body = {"prompt": "Hi", "max_new_tokens": 512, "ignore_eos": True}
    assert api.call("POST", "/generate", body).status == 504
    assert _ending(records) == "error"
    streamed = api.call("POST", "/generate", {**body, "stream": True})
    assert streamed.status == 200 and b"timeout" in streamed.body  # the error event
    assert _ending(records) == "error"

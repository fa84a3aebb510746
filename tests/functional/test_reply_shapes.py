"""Every reply the API sends has the shape /openapi.json publishes for it (#28 item 5):
whole answers and every event of a stream (SSE `data:` objects, Ollama's NDJSON lines),
with logprobs, usage chunks, several choices and tool calls, checked against the
document's own schemas (core.protocol.replies). The adapters send the core's bytes
(test_api.py's parity tests), so the core is checked here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ortserve.core.api import Api
from ortserve.core.openapi import openapi_document
from ortserve.core.routes import TABLE, Route
from ortserve.core.settings import ServerSettings
from ortserve.core.state import ModelState
from tests.functional.harness import API_KEY, InProcess

# No parameters: the random tiny model's call is then short enough to end in its limit.
TIME = {
    "type": "function",
    "function": {"name": "time", "parameters": {"type": "object", "properties": {}}},
}
CHAT = [{"role": "user", "content": "Say hi"}]
# Each generation route's bodies: plain, and with the options that change the reply's shape.
BODIES: dict[str, list[dict[str, Any]]] = {
    "/generate": [{"prompt": "Hello", "max_new_tokens": 4}],
    "/v1/completions": [
        {"model": "m", "prompt": "Hello", "max_tokens": 4},
        {"model": "m", "prompt": "Hello", "max_tokens": 4, "logprobs": 2, "n": 2},
    ],
    "/v1/chat/completions": [
        {"model": "m", "messages": CHAT, "max_tokens": 4},
        {"model": "m", "messages": CHAT, "max_tokens": 4, "logprobs": True, "top_logprobs": 2},
        {
            "model": "m",
            "messages": CHAT,
            "max_tokens": 24,
            "tools": [TIME],
            "tool_choice": "required",
        },
    ],
    "/v1/responses": [
        {"model": "m", "input": "Hello", "max_output_tokens": 4},
        {
            "model": "m",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
            "instructions": "Be brief.",
            "max_output_tokens": 24,
            "tools": [
                {"type": "function", "name": "time", "parameters": TIME["function"]["parameters"]}  # type: ignore[index]
            ],
            "tool_choice": "required",
        },
    ],
    "/v1/messages": [
        {"model": "m", "messages": CHAT, "max_tokens": 4, "system": "Be brief."},
        {
            "model": "m",
            "messages": CHAT,
            "max_tokens": 24,
            "tools": [{"name": "time", "input_schema": TIME["function"]["parameters"]}],  # type: ignore[index]
            "tool_choice": {"type": "any"},
        },
    ],
    "/api/generate": [{"model": "m", "prompt": "Hello", "options": {"num_predict": 4}}],
    "/api/chat": [
        {"model": "m", "messages": CHAT, "options": {"num_predict": 4}},
        {"model": "m", "messages": CHAT, "options": {"num_predict": 24}, "tools": [TIME]},
    ],
}
GETS = {"/v1/models", "/v1/models/m", "/healthz", "/readyz", "/api/tags", "/api/ps", "/api/version"}


@pytest.fixture(scope="module")
def core(tiny_model_dir: Path) -> InProcess:
    settings = ServerSettings(
        model_dir=tiny_model_dir, providers="cpu", api_keys=[API_KEY], served_name="m"
    )
    state = ModelState(settings)
    state.load()
    assert state.status == "ready", state.reason
    return InProcess(Api(state, settings))


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return openapi_document(TABLE, 2000)


def _validate(document: dict[str, Any], name: str, instance: Any) -> None:
    schema = {**document["components"]["schemas"][name.rsplit("/", 1)[-1]]}
    schema["components"] = document["components"]
    jsonschema.validate(instance, schema, cls=jsonschema.Draft202012Validator)


def _route(path: str) -> Route:
    route = next((r for r in TABLE if r.path == path), None)
    return route or next(r for r in TABLE if r.prefix and path.startswith(r.prefix))


def _stream_objects(route: Route, body: bytes) -> list[Any]:
    if route.ollama:
        return [json.loads(line) for line in body.splitlines() if line]
    # An event's data line (Anthropic's events have an `event:` line before it).
    events = [b.split(b"\n")[-1].removeprefix(b"data: ") for b in body.split(b"\n\n") if b]
    assert events[-1] == b"[DONE]" or route.path in ("/generate", "/v1/responses", "/v1/messages")
    return [json.loads(e) for e in events if e != b"[DONE]"]


def _events_schema(document: dict[str, Any], route: Route) -> dict[str, Any]:
    refs = [{"$ref": ref["$ref"]} for ref in _media(document, route, stream=True)["x-events"]]
    return {"anyOf": refs, "components": document["components"]}


def _media(document: dict[str, Any], route: Route, stream: bool) -> dict[str, Any]:
    content = document["paths"][route.path][route.method.lower()]["responses"]["200"]["content"]
    kind = "application/x-ndjson" if route.ollama else "text/event-stream"
    return dict(content[kind] if stream else content["application/json"])


@pytest.mark.parametrize("path", sorted(BODIES))
def test_every_answer_and_every_event_has_the_published_shape(
    core: InProcess, document: dict[str, Any], path: str
) -> None:
    route = _route(path)
    whole_ref = _media(document, route, stream=False)["schema"]["$ref"]
    for body in BODIES[path]:
        whole = core.call("POST", path, {**body, "stream": False})
        assert whole.status == 200, whole.body
        _validate(document, whole_ref, whole.json())
        streamed = {**body, "stream": True}
        if path in ("/v1/completions", "/v1/chat/completions"):
            streamed["stream_options"] = {"include_usage": True}
        stream = core.call("POST", path, streamed)
        assert stream.status == 200, stream.body
        if body.get("tool_choice") in ("required", {"type": "any"}):  # calls' shapes too
            call = {"/v1/responses": b'"function_call"', "/v1/messages": b'"tool_use"'}.get(
                path, b'"tool_calls"'
            )
            assert call in whole.body and call in stream.body
        objects = _stream_objects(route, stream.body)
        assert len(objects) >= 2
        validator = jsonschema.Draft202012Validator(_events_schema(document, route))
        for item in objects:
            validator.validate(item)


def test_every_get_answer_has_the_published_shape(
    core: InProcess, document: dict[str, Any]
) -> None:
    for path in sorted(GETS):
        route = _route(path)
        reply = core.call("GET", path)
        assert reply.status == 200, (path, reply.body)
        _validate(document, _media(document, route, stream=False)["schema"]["$ref"], reply.json())
    assert {_route(p).path for p in GETS} == {
        r.path for r in TABLE if r.method == "GET" and r.reply is not None
    }  # every route with a reply shape is checked here


def test_a_token_count_has_the_published_shape(core: InProcess, document: dict[str, Any]) -> None:
    route = _route("/v1/messages/count_tokens")
    reply = core.call("POST", route.path, {"model": "m", "messages": CHAT})
    assert reply.status == 200, reply.body
    _validate(document, _media(document, route, stream=False)["schema"]["$ref"], reply.json())

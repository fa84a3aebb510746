"""The official `ollama` Python client against each HTTP target's Ollama API (/api/*)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import ollama
import pytest

from tests.functional.harness import API_KEY, edge_server, gcf_server

MODEL = "ortserve/tiny-llama-random-weights"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module", params=["gcf", "edge"])
def client(
    request: pytest.FixtureRequest, tiny_gcf_bundle: Path, tiny_model_dir: Path
) -> Iterator[ollama.Client]:
    server = gcf_server(tiny_gcf_bundle) if request.param == "gcf" else edge_server(tiny_model_dir)
    with server as base:
        yield ollama.Client(host=base, headers=AUTH)


def test_list_show_and_version(client: ollama.Client) -> None:
    models = client.list().models
    assert [m.model for m in models] == [MODEL]
    assert models[0].details is not None and models[0].details.quantization_level == "int4"
    assert models[0].size and models[0].digest
    shown = client.show(MODEL)
    assert shown.template and {"completion", "tools"} <= set(shown.capabilities or [])
    # The context and the limit, where Ollama's clients read them.
    assert shown.modelinfo and shown.modelinfo["onnx.context_length"] == 2048
    assert shown.modelinfo["ortserve.max_new_tokens"] == 2000
    assert (shown.parameters or "").split() == [
        *("num_ctx", "2048", "num_predict", "2000"),
        *("temperature", "0.0", "top_p", "1.0", "top_k", "0", "repeat_penalty", "1.0"),
    ]
    with pytest.raises(ollama.ResponseError) as info:
        client.show("llama3:8b")
    assert info.value.status_code == 404 and "not found" in info.value.error
    version = httpx.get(f"{client._client.base_url}/api/version", headers=AUTH).json()
    assert isinstance(version["version"], str)


def test_name_latest_is_the_served_model(client: ollama.Client) -> None:
    """Ollama's clients may add `:latest` (or change the case): the one model answers."""
    for name in (f"{MODEL}:latest", MODEL.upper()):
        reply = client.chat(
            model=name, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2}
        )
        assert reply.done and reply.model == MODEL
        assert client.show(name).details is not None


def test_chat_and_streamed_chat_agree(client: ollama.Client) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    options = {"temperature": 0, "num_predict": 12}
    whole = client.chat(model=MODEL, messages=messages, options=options)
    assert whole.done and whole.done_reason in {"stop", "length"}
    assert whole.message.role == "assistant" and whole.eval_count and whole.eval_count <= 12
    assert whole.prompt_eval_count and whole.total_duration
    parts = list(client.chat(model=MODEL, messages=messages, options=options, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count


def test_generate_raw_and_templated(client: ollama.Client) -> None:
    options = {"temperature": 0, "num_predict": 8, "stop": ["\n\n"]}
    templated = client.generate(model=MODEL, prompt="Why is the sky blue?", options=options)
    raw = client.generate(model=MODEL, prompt="Why is the sky blue?", options=options, raw=True)
    assert templated.done and raw.done
    # The chat template wraps the prompt: more prompt tokens than the raw prompt.
    assert (templated.prompt_eval_count or 0) > (raw.prompt_eval_count or 0)
    streamed = client.generate(
        model=MODEL, prompt="Why is the sky blue?", options=options, stream=True
    )
    assert "".join(p.response or "" for p in streamed) == templated.response


def test_structured_output(client: ollama.Client) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
        "additionalProperties": False,
    }
    reply = client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Where?"}],
        format=schema,
        options={"seed": 1, "num_predict": 40},
    )
    jsonschema.validate(json.loads(reply.message.content or ""), schema)


def test_errors_in_ollamas_shape(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="llama3:8b", messages=[{"role": "user", "content": "Hi"}])
    assert info.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as info:
        client.generate(model=MODEL, prompt="x", options={"num_predict": 10**6})
    assert info.value.status_code == 400 and "num_predict" in info.value.error
    unauthorized = ollama.Client(host=str(client._client.base_url))
    with pytest.raises(ollama.ResponseError) as info:
        unauthorized.list()
    assert info.value.status_code == 401


def test_load_unload_and_ps(client: ollama.Client) -> None:
    """Ollama's load and unload requests answer 200 (the model stays loaded), and
    `ollama ps` lists the served model, loaded for good (keep_alive -1's expiry)."""
    loaded = client.generate(model=MODEL)
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    unloaded = client.generate(model=MODEL, keep_alive=0)
    assert unloaded.done and unloaded.done_reason == "unload" and not unloaded.eval_count
    chat = client.chat(model=MODEL, messages=[], keep_alive="0s")
    assert chat.done_reason == "unload" and chat.message.content == ""
    assert client.chat(model=MODEL, messages=[]).done_reason == "load"
    with pytest.raises(ollama.ResponseError) as info:
        client.generate(model="llama3:8b")
    assert info.value.status_code == 404
    (running,) = client.ps().models  # still there after the unload request
    (listed,) = client.list().models
    assert running.model == running.name == MODEL and running.size == listed.size
    assert running.digest == listed.digest and running.details == listed.details
    assert running.expires_at is not None
    assert running.expires_at > datetime.now(UTC) + timedelta(days=365 * 200)
    assert running.size_vram == 0  # on the CPU


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
        },
    },
}
# A call as the model writes one; `format` holds a random-weight model to it.
CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}


def test_tools_on_chat(client: ollama.Client) -> None:
    """Ollama's `tools` on /api/chat: a call comes back as message.tool_calls with its
    arguments as an object; the result goes back as a `tool` message."""
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    options = {"seed": 1, "num_predict": 120}
    reply = client.chat(model=MODEL, messages=ask, tools=[WEATHER], format=CALL, options=options)
    assert reply.done and reply.message.content == ""
    (call,) = reply.message.tool_calls or []
    assert call.function.name == "get_weather"
    jsonschema.validate(dict(call.function.arguments), CALL["properties"]["arguments"])  # type: ignore[index]
    streamed = list(
        client.chat(
            model=MODEL, messages=ask, tools=[WEATHER], format=CALL, options=options, stream=True
        )
    )
    assert [c for p in streamed for c in p.message.tool_calls or []] == [call]
    assert streamed[-1].done and not any(p.message.content for p in streamed)
    turn = {"role": "assistant", "content": "", "tool_calls": [call]}
    result = {"role": "tool", "content": "18 C, sunny", "tool_name": "get_weather"}
    history: list[dict[str, Any]] = [*ask, turn, result]
    answer = client.chat(
        model=MODEL, messages=history, tools=[WEATHER], options={"seed": 1, "num_predict": 8}
    )
    assert answer.done and answer.eval_count


def test_images_are_refused_clearly(client: ollama.Client) -> None:
    message = {"role": "user", "content": "What is this?", "images": ["aGk="]}
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model=MODEL, messages=[message])
    assert info.value.status_code == 400 and "takes no images" in info.value.error

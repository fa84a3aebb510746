"""The official `ollama` Python client against each HTTP target's Ollama API (/api/*)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

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
    assert shown.template and "completion" in (shown.capabilities or [])
    with pytest.raises(ollama.ResponseError) as info:
        client.show("llama3:8b")
    assert info.value.status_code == 404 and "not found" in info.value.error
    version = httpx.get(f"{client._client.base_url}/api/version", headers=AUTH).json()
    assert isinstance(version["version"], str)


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
    streamed = client.generate(model=MODEL, prompt="Why is the sky blue?", options=options,
                               stream=True)  # fmt: skip
    assert "".join(p.response or "" for p in streamed) == templated.response


def test_structured_output(client: ollama.Client) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
              "required": ["city"], "additionalProperties": False}  # fmt: skip
    reply = client.chat(model=MODEL, messages=[{"role": "user", "content": "Where?"}],
                        format=schema, options={"seed": 1, "num_predict": 40})  # fmt: skip
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

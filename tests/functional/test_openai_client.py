"""The official `openai` Python client against each HTTP target's /v1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.functional.harness import API_KEY, edge_server, gcf_server

MODEL = "ortserve/tiny-llama-random-weights"


@pytest.fixture(scope="module", params=["gcf", "edge"])
def client(
    request: pytest.FixtureRequest, tiny_gcf_bundle: Path, tiny_model_dir: Path
) -> Iterator[openai.OpenAI]:
    server = gcf_server(tiny_gcf_bundle) if request.param == "gcf" else edge_server(tiny_model_dir)
    with server as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)


def test_an_empty_or_case_changed_model_name_is_the_served_model(client: openai.OpenAI) -> None:
    """`model=""` (llama-server's clients send it) and another case name the one model."""
    for model in ("", MODEL.upper()):
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        assert reply.model == MODEL
    assert client.models.retrieve(MODEL.upper()).id == MODEL


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    # vLLM's max_model_len (the context) and the limit (the harness's MAX_NEW_TOKENS).
    card = client.models.retrieve(MODEL)
    assert (card.model_extra or {}) == {"max_model_len": 2048, "max_tokens": 2000}
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    # Asked for a null temperature, the client sends `"temperature": null`: the default.
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=None
    )
    assert reply.choices[0].finish_reason in {"stop", "length"}


def test_completion(client: openai.OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, seed=1)
    assert completion.choices[0].finish_reason in {"stop", "length"}
    assert completion.usage is not None and completion.usage.completion_tokens <= 8


def test_chat_stream_with_usage_equals_non_stream(client: openai.OpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]
    whole = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0
    )
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def test_stop_and_seed(client: openai.OpenAI) -> None:
    def run(seed: int, stop: list[str] | None = None) -> str:
        completion = client.completions.create(
            model=MODEL, prompt="Edge", max_tokens=24, temperature=1.0, seed=seed, stop=stop
        )
        return completion.choices[0].text

    first = run(5)
    assert first == run(5)
    assert first != run(6)
    stop = first[4:7]
    assert run(5, [stop]) == first[: first.find(stop)]


def test_json_schema_response_format(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "n?"}],
        max_tokens=40,
        seed=4,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    )
    assert isinstance(json.loads(chat.choices[0].message.content or "")["n"], int)


def test_errors_become_client_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=4)
    assert "messages" in bad.value.message
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")
    wrong = openai.OpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_n_choices_and_logprobs(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=6,
        n=2,
        seed=3,
        logprobs=True,
        top_logprobs=2,
    )
    assert [c.index for c in reply.choices] == [0, 1]
    for choice in reply.choices:
        assert choice.logprobs is not None and choice.logprobs.content
        assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=6,
        n=2,
        seed=3,
        stream=True,
    )
    texts = ["", ""]
    for chunk in stream:
        for part in chunk.choices:
            texts[part.index] += part.delta.content or ""
    assert texts == [c.message.content for c in reply.choices]


def test_tool_calls_with_the_client(client: openai.OpenAI) -> None:
    """A weather tool called with tool_choice="required": arguments that validate; the
    follow-up with the result answers in text; streaming assembles the same call."""
    from openai.types.chat import ChatCompletionToolParam

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}},
        "required": ["city"],
        "additionalProperties": False,
    }
    weather = {"name": "get_weather", "description": "The weather in a city", "parameters": schema}
    tools: list[ChatCompletionToolParam] = [{"type": "function", "function": weather}]  # type: ignore[typeddict-item]
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Paris?"}]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=tools,
        tool_choice="required",
        max_tokens=40,
        seed=4,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), schema)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=tools,
        tool_choice="required",
        max_tokens=40,
        seed=4,
        stream=True,
    )
    name, arguments, finish = "", "", None
    for chunk in stream:
        for part in chunk.choices:
            for delta in part.delta.tool_calls or []:
                name += (delta.function.name or "") if delta.function else ""
                arguments += (delta.function.arguments or "") if delta.function else ""
            finish = part.finish_reason or finish
    assert (name, arguments, finish) == ("get_weather", call.function.arguments, "tool_calls")
    follow: list[ChatCompletionMessageParam] = [
        *messages,
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"},
    ]
    answer = client.chat.completions.create(
        model=MODEL, messages=follow, tools=tools, tool_choice="none", max_tokens=8
    )
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls

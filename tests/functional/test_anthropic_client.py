"""The official `anthropic` Python client against each HTTP target's Messages API
(/v1/messages): buffered, `messages.stream`, stop sequences, a tool round trip,
count_tokens, both ways of sending the key, and Anthropic's error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import anthropic
import httpx
import jsonschema
import openai
import pytest
from anthropic.types import MessageParam, ToolParam, ToolUseBlockParam

from tests.functional.harness import API_KEY, edge_server, gcf_server

MODEL = "ortserve/tiny-llama-random-weights"
SYSTEM = "Be brief."
QUESTION = "Tell me about the sea"
ASK: list[MessageParam] = [{"role": "user", "content": QUESTION}]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER: ToolParam = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": SCHEMA,
}


@pytest.fixture(scope="module", params=["gcf", "edge"])
def base(
    request: pytest.FixtureRequest, tiny_gcf_bundle: Path, tiny_model_dir: Path
) -> Iterator[str]:
    server = gcf_server(tiny_gcf_bundle) if request.param == "gcf" else edge_server(tiny_model_dir)
    with server as url:
        yield url


@pytest.fixture(scope="module")
def client(base: str) -> anthropic.Anthropic:
    # The client sends the key as `x-api-key`, as it does to Anthropic.
    return anthropic.Anthropic(base_url=base, api_key=API_KEY, max_retries=0)


def test_a_message_is_the_chat_completion_of_the_same_conversation(
    client: anthropic.Anthropic, base: str
) -> None:
    """The system prompt and the turns reach the model as the OpenAI chat route's do: the
    same greedy text, the same prompt tokens."""
    message = client.messages.create(model=MODEL, max_tokens=12, system=SYSTEM, messages=ASK)
    assert (message.type, message.role, message.model) == ("message", "assistant", MODEL)
    assert message.id.startswith("msg_")
    assert [block.type for block in message.content] == ["text"]
    assert message.stop_reason in {"end_turn", "max_tokens"} and message.stop_sequence is None
    assert 0 < message.usage.output_tokens <= 12
    chat = openai.OpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
    completion = chat.chat.completions.create(
        model=MODEL,
        max_tokens=12,
        temperature=0,
        messages=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": QUESTION},
        ],
    )
    assert message.content[0].text == completion.choices[0].message.content  # type: ignore[union-attr]
    assert completion.usage is not None
    # Anthropic counts the tokens the prompt cache held apart from input_tokens.
    prompt = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert prompt == completion.usage.prompt_tokens
    assert message.usage.output_tokens == completion.usage.completion_tokens
    length = "max_tokens" if completion.choices[0].finish_reason == "length" else "end_turn"
    assert message.stop_reason == length


def test_a_stream_is_anthropics_event_sequence_and_adds_up_to_the_message(
    client: anthropic.Anthropic, base: str
) -> None:
    whole = client.messages.create(model=MODEL, max_tokens=12, system=SYSTEM, messages=ASK)
    with client.messages.stream(model=MODEL, max_tokens=12, system=SYSTEM, messages=ASK) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text  # type: ignore[union-attr]
    assert [(b.type, getattr(b, "text", None)) for b in final.content] == [("text", text)]
    assert final.stop_reason == whole.stop_reason
    assert final.usage.input_tokens == whole.usage.input_tokens
    assert final.usage.output_tokens == whole.usage.output_tokens
    # The raw events: each named after its type, in Anthropic's order, no [DONE].
    body = {
        "model": MODEL,
        "max_tokens": 12,
        "system": SYSTEM,
        "messages": ASK,
        "temperature": 0,
        "stream": True,
    }
    reply = httpx.post(f"{base}/v1/messages", json=body, headers={"x-api-key": API_KEY}, timeout=60)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = [e for e in reply.text.split("\n\n") if e]
    names = [e.splitlines()[0].removeprefix("event: ") for e in events]
    datas = [json.loads(e.splitlines()[1].removeprefix("data: ")) for e in events]
    assert [d["type"] for d in datas] == names
    deltas = names.count("content_block_delta")
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = datas[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    # message_start states the whole prompt; message_delta says what the cache held.
    prompt = whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    assert start["usage"]["input_tokens"] == prompt
    assert (
        datas[-2]["usage"]["input_tokens"] + datas[-2]["usage"]["cache_read_input_tokens"] == prompt
    )
    assert datas[-2]["delta"] == {"stop_reason": whole.stop_reason, "stop_sequence": None}


def test_a_stop_sequence_ends_the_text_and_is_named(client: anthropic.Anthropic) -> None:
    whole = client.messages.create(model=MODEL, max_tokens=24, messages=ASK)
    text = whole.content[0].text  # type: ignore[union-attr]
    stop = text[len(text) // 2 :][:2]
    assert stop.strip(), f"no stop string to cut at in {text!r}"
    for streamed in (False, True):
        cut: anthropic.types.Message
        if streamed:
            with client.messages.stream(
                model=MODEL, max_tokens=24, messages=ASK, stop_sequences=[stop]
            ) as stream:
                cut = stream.get_final_message()
        else:
            cut = client.messages.create(
                model=MODEL, max_tokens=24, messages=ASK, stop_sequences=[stop]
            )
        assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
        assert cut.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]


def test_a_tool_round_trip(client: anthropic.Anthropic) -> None:
    """tool_choice `any`: a tool_use block whose input validates; streamed, the same call;
    the result sent back as a tool_result block gets a text answer."""
    called = client.messages.create(
        model=MODEL, max_tokens=40, messages=ASK, tools=[WEATHER], tool_choice={"type": "any"}
    )
    assert called.stop_reason == "tool_use"
    use = called.content[0]
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, SCHEMA)
    with client.messages.stream(
        model=MODEL, max_tokens=40, messages=ASK, tools=[WEATHER], tool_choice={"type": "any"}
    ) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in streamed.content] == [
        ("tool_use", use.input)
    ]
    follow: list[MessageParam] = [
        *ASK,
        {"role": "assistant", "content": [cast(ToolUseBlockParam, use.model_dump())]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "18 C, sunny"},
                {"type": "text", "text": "So?"},
            ],
        },
    ]
    answer = client.messages.create(
        model=MODEL, max_tokens=8, messages=follow, tools=[WEATHER], tool_choice={"type": "none"}
    )
    assert answer.content[0].type == "text" and answer.stop_reason in {"end_turn", "max_tokens"}
    # count_tokens renders the conversation as the message did (tool_choice none: the
    # tools are not in the prompt); with tools offered, they are.
    counted = client.messages.count_tokens(
        model=MODEL, messages=follow, tools=[WEATHER], tool_choice={"type": "none"}
    )
    offered = client.messages.count_tokens(model=MODEL, messages=follow, tools=[WEATHER])
    assert offered.input_tokens > counted.input_tokens
    assert counted.input_tokens == answer.usage.input_tokens + (
        answer.usage.cache_read_input_tokens or 0
    )


def test_count_tokens_counts_the_prompt_a_message_gets(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model=MODEL, max_tokens=2, system=SYSTEM, messages=ASK)
    counted = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=ASK)
    assert counted.input_tokens == message.usage.input_tokens + (
        message.usage.cache_read_input_tokens or 0
    )
    assert (
        client.messages.count_tokens(model=MODEL, messages=ASK).input_tokens < counted.input_tokens
    )


def test_a_bearer_token_is_a_key_too(base: str) -> None:
    bearer = anthropic.Anthropic(base_url=base, auth_token=API_KEY, max_retries=0)
    assert bearer.messages.create(model=MODEL, max_tokens=2, messages=ASK).type == "message"
    nobody = anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        nobody.messages.create(model=MODEL, max_tokens=2, messages=ASK)
    assert _error(refused.value)["type"] == "authentication_error"


def _error(exc: anthropic.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return dict(body["error"])


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "this model takes no images",
        ),
        ({"max_tokens": None}, "max_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "custom tools"),
        ({"messages": [*ASK, {"role": "assistant", "content": "The sea"}]}, "prefill"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "at most 4"),
        ({"temperature": 1.5}, "temperature"),
        ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]}, "not one of"),
    ],
)
def test_bad_requests_get_anthropics_400(
    client: anthropic.Anthropic, change: dict[str, Any], words: str
) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 4, "messages": ASK, **change}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.post("/v1/messages", body=body, cast_to=httpx.Response)
    error = _error(refused.value)
    assert error["type"] == "invalid_request_error" and words in error["message"]


def test_another_model_is_anthropics_404(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as refused:
        client.messages.create(model="another-model", max_tokens=2, messages=ASK)
    error = _error(refused.value)
    assert error["type"] == "not_found_error" and MODEL in error["message"]


def test_structured_output_follows_the_schema(client: anthropic.Anthropic) -> None:
    """output_config.format json_schema: the text is JSON valid against the schema."""
    message = client.messages.create(
        model=MODEL,
        max_tokens=40,
        messages=ASK,
        output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
    )
    text = message.content[0].text  # type: ignore[union-attr]
    jsonschema.validate(json.loads(text), SCHEMA)
    assert message.stop_reason == "end_turn"

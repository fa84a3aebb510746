"""The official `openai` Python client against each HTTP target's /v1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import cast

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
    # vLLM's max_model_len (the context), the limit (the harness's MAX_NEW_TOKENS), and the
    # sampling a request that sends none gets (the tiny model's: greedy, no penalty).
    card = client.models.retrieve(MODEL)
    assert (card.model_extra or {}) == {
        "max_model_len": 2048,
        "max_tokens": 2000,
        "sampling": {
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": 0,
            "repetition_penalty": 1.0,
            "origin": "generation_config.json",
        },
    }
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


# -- the Responses API -------------------------------------------------------------------


def test_responses_create_and_output_text(client: openai.OpenAI) -> None:
    reply = client.responses.create(
        model=MODEL, input="Hi", instructions="Be brief.", max_output_tokens=8, temperature=0
    )
    assert reply.object == "response" and reply.model == MODEL
    assert reply.output[0].type == "message"
    assert reply.output_text == reply.output[0].content[0].text  # type: ignore[union-attr]
    assert reply.usage is not None and 0 < reply.usage.output_tokens <= 8
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    assert reply.usage.input_tokens_details.cached_tokens >= 0
    # Message items with input_text parts are the same conversation as the string.
    items = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
        instructions="Be brief.",
        max_output_tokens=8,
        temperature=0,
    )
    assert items.output_text == reply.output_text


def test_responses_at_the_token_limit_are_incomplete(client: openai.OpenAI) -> None:
    reply = client.responses.create(model=MODEL, input="Tell a long story", max_output_tokens=1)
    assert reply.status == "incomplete"
    assert reply.incomplete_details is not None
    assert reply.incomplete_details.reason == "max_output_tokens"


def test_responses_stream_events_in_order(client: openai.OpenAI) -> None:
    whole = client.responses.create(model=MODEL, input="Hi", max_output_tokens=8, temperature=0)
    events = list(
        client.responses.create(
            model=MODEL, input="Hi", max_output_tokens=8, temperature=0, stream=True
        )
    )
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    last = "response.completed" if whole.status == "completed" else "response.incomplete"
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        last,
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    # The SDK's stream helper reads the same events.
    with client.responses.stream(
        model=MODEL, input="Hi", max_output_tokens=8, temperature=0
    ) as stream:
        helped = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    assert helped == text


def test_responses_tools_round_trip(client: openai.OpenAI) -> None:
    """A required call comes out as a function_call item; its output goes back as a
    function_call_output item (beside the call) and the model answers in text."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}},
        "required": ["city"],
        "additionalProperties": False,
    }
    from openai.types.responses import FunctionToolParam, ResponseInputItemParam

    tool: FunctionToolParam = {
        "type": "function",
        "name": "get_weather",
        "parameters": schema,
        "strict": True,
    }
    reply = client.responses.create(
        model=MODEL,
        input="Paris?",
        tools=[tool],
        tool_choice="required",
        max_output_tokens=40,
    )
    call = reply.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), schema)
    follow = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Paris?"},
            cast(ResponseInputItemParam, call),  # the output item, as users pass it back
            {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"},
        ],
        tools=[tool],
        tool_choice="none",
        max_output_tokens=8,
    )
    assert follow.output[0].type == "message" and follow.output_text
    # Or by previous_response_id: the call comes from the kept conversation.
    chained = client.responses.create(
        model=MODEL,
        previous_response_id=reply.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}],
        tools=[tool],
        tool_choice="none",
        max_output_tokens=8,
    )
    assert chained.usage is not None and follow.usage is not None
    assert chained.usage.input_tokens == follow.usage.input_tokens


def test_responses_previous_response_id(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
    second = client.responses.create(
        model=MODEL, input="And then?", previous_response_id=first.id, max_output_tokens=4
    )
    alone = client.responses.create(model=MODEL, input="And then?", max_output_tokens=4)
    assert second.previous_response_id == first.id
    assert second.usage is not None and alone.usage is not None
    assert second.usage.input_tokens > alone.usage.input_tokens  # the first turn came too
    unkept = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=False)
    for missing in ("resp_nothing", unkept.id):
        with pytest.raises(openai.BadRequestError) as bad:
            client.responses.create(model=MODEL, input="x", previous_response_id=missing)
        assert bad.value.param == "previous_response_id"
        assert "whole conversation" in bad.value.message

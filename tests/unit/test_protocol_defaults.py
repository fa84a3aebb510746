"""What each API's body means when a field is left out or null (core.protocol), without
a model (#28 item 7): the defaults and limits reach the GenerationRequest."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ortserve.core.errors import InvalidRequestError
from ortserve.core.protocol.bodies import parse
from ortserve.core.protocol.chat import ChatBody
from ortserve.core.protocol.native import GenerateBody
from ortserve.core.protocol.ollama import OllamaGenerateBody
from ortserve.core.protocol.openai import CompletionBody
from ortserve.core.protocol.responses import ResponsesBody
from ortserve.core.protocol.serving import Served

SERVED = Served("m", "0" * 64, "2026-01-01T00:00:00Z", 2000, 512, context_length=4096)
CHAT = [{"role": "user", "content": "hi"}]


def _body(body_type: Any, **fields: Any) -> Any:
    return parse(body_type, json.dumps(fields).encode())


def test_openai_chat_defaults_to_as_many_as_fit_and_null_means_default() -> None:
    left_out = _body(ChatBody, model="m", messages=CHAT).to_generation(SERVED)
    nulls = _body(
        ChatBody, model="m", messages=CHAT, max_tokens=None, temperature=None, stop=None
    ).to_generation(SERVED)
    assert left_out == nulls
    assert left_out.options.max_new_tokens == SERVED.default_new_tokens
    assert left_out.options.temperature is None  # the model's default (core.generation)
    assert left_out.limit_field == "max_tokens" and left_out.logprobs is None


def test_max_completion_tokens_is_the_limit_the_error_names() -> None:
    request = _body(ChatBody, model="m", messages=CHAT, max_completion_tokens=7)
    generation = request.to_generation(SERVED)
    assert generation.options.max_new_tokens == 7
    assert generation.limit_field == "max_completion_tokens"


def test_openai_completions_default_to_16_tokens() -> None:
    generation = _body(CompletionBody, model="m", prompt="x").to_generation(SERVED)
    assert generation.options.max_new_tokens == 16  # OpenAI's completions default
    assert generation.prompt == "x"


def test_logprobs_and_top_logprobs_go_together() -> None:
    generation = _body(
        ChatBody, model="m", messages=CHAT, logprobs=True, top_logprobs=3
    ).to_generation(SERVED)
    assert generation.logprobs == 3
    with pytest.raises(InvalidRequestError, match="top_logprobs needs logprobs") as caught:
        _body(ChatBody, model="m", messages=CHAT, top_logprobs=3).to_generation(SERVED)
    assert caught.value.param == "top_logprobs"


def test_ollama_num_predict_minus_one_is_as_many_as_fit() -> None:
    body = _body(OllamaGenerateBody, model="m", prompt="x", options={"num_predict": -1})
    assert body.to_generation(SERVED).options.max_new_tokens == SERVED.default_new_tokens


def test_an_unknown_field_names_the_nearest_and_a_bad_value_is_named() -> None:
    # A typo is a 400, as OpenAI answers (#39: `max_token` was ignored: 512 tokens).
    with pytest.raises(InvalidRequestError) as caught:
        _body(GenerateBody, prompt="x", max_new_token=5)
    assert caught.value.param == "max_new_token"
    assert "did you mean max_new_tokens?" in caught.value.message
    with pytest.raises(InvalidRequestError) as caught:
        _body(GenerateBody, prompt="x", temperature="hot")
    assert caught.value.param == "temperature"


@pytest.mark.parametrize("body_type", [ChatBody, CompletionBody])
def test_openais_penalties_are_taken_at_zero_and_refused_in_words_above(body_type: Any) -> None:
    """ortserve applies neither frequency/presence penalty nor logit_bias: their no-op
    values (what clients send by default) are taken, anything else is a 400 that says so,
    never silently ignored."""
    asked = {"messages": [{"role": "user", "content": "x"}]} if body_type is ChatBody else {}
    prompt = {} if body_type is ChatBody else {"prompt": "x"}
    fields = {"frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}}
    body = _body(body_type, model="m", **asked, **prompt, **fields)
    assert body.to_generation(SERVED).options.repetition_penalty is None  # the model's
    for name, value in (
        ("frequency_penalty", 0.5),
        ("presence_penalty", -1),
        ("logit_bias", {"50256": -100}),
    ):
        with pytest.raises(InvalidRequestError) as caught:
            _body(body_type, model="m", **asked, **prompt, **{name: value})
        assert caught.value.param == name
        assert "not applied by this server" in caught.value.message
        assert "repetition_penalty" in caught.value.message


def test_an_error_never_repeats_a_huge_name_or_id() -> None:
    """Hostile input: a megabyte-long unknown key, or previous_response_id, is named in
    the 400 by its first characters only (the reply and the log line stay small)."""
    with pytest.raises(InvalidRequestError) as caught:
        parse(ChatBody, json.dumps({"messages": [], "x" * 1_000_000: 1}).encode())
    assert len(caught.value.message) < 200 and caught.value.param == "x" * 64 + "…"
    with pytest.raises(InvalidRequestError) as caught:
        parse(
            ResponsesBody, json.dumps({"input": "x", "previous_response_id": "r" * 10**6}).encode()
        )
    assert caught.value.param == "previous_response_id" and len(caught.value.message) < 200

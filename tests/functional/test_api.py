"""The HTTP API through every target: native and OpenAI routes, streaming, errors, auth."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from ortserve.core import playground
from ortserve.core.api import Api
from ortserve.core.settings import ServerSettings
from ortserve.core.state import ModelState
from tests.functional.harness import (
    API_KEY,
    AUTH,
    Http,
    InProcess,
    Reply,
    Target,
    edge_server,
    gcf_server,
    normalized,
)
from tests.functional.lambda_target import LambdaTarget, lambda_app
from tests.functional.targets import TARGETS, open_target

MODEL = "ortserve/tiny-llama-random-weights"


def _settings(model_dir: Path, **kw: object) -> ServerSettings:
    return ServerSettings(
        model_dir=model_dir,
        providers="cpu",
        api_keys=[API_KEY, "other-key"],
        max_body_bytes=64 * 1024,
        **{"max_new_tokens": 2000, **kw},  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def core_api(tiny_model_dir: Path) -> Api:
    settings = _settings(tiny_model_dir)
    state = ModelState(settings)
    state.load()
    assert state.status == "ready", state.reason
    return Api(state, settings)


@pytest.fixture(scope="module", params=["core", "gcf", "edge", "lambda"])
def target(
    request: pytest.FixtureRequest, core_api: Api, tiny_gcf_bundle: Path, tiny_model_dir: Path
) -> Iterator[Target]:
    if request.param == "core":
        yield InProcess(core_api)
    elif request.param == "gcf":
        with gcf_server(tiny_gcf_bundle) as base:
            yield Http("gcf", base)
    elif request.param == "edge":
        with edge_server(tiny_model_dir) as base:
            yield Http("edge", base)
    elif request.param == "lambda":
        yield LambdaTarget(lambda_app(tiny_model_dir).handle)


@pytest.fixture(scope="module")
def reference(core_api: Api) -> Target:
    return InProcess(core_api)


def _error(reply: Reply, status: int, code: str | None = None) -> dict[str, object]:
    assert reply.status == status, reply.body
    body = reply.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert {"message", "type", "code"} <= set(error)
    assert isinstance(error["message"], str) and error["message"]
    text = json.dumps(body)
    assert "Traceback" not in text and "pydantic" not in text and "errors.pydantic.dev" not in text
    if code is not None:
        assert error["code"] == code, error
    return error  # type: ignore[no-any-return]


GREEDY = {"max_new_tokens": 24, "temperature": 0}


# -- native API --------------------------------------------------------------------------


def test_generate(target: Target) -> None:
    reply = target.call("POST", "/generate", {"prompt": "Hello there", **GREEDY})
    assert reply.status == 200
    body = reply.json()
    assert set(body) == {"generated_text", "tokens_generated", "prompt_tokens", "finish_reason"}
    assert body["tokens_generated"] <= 24
    assert body["finish_reason"] in {"stop", "length"}
    assert reply.headers["content-type"] == "application/json"


def test_generate_stream_equals_non_stream(target: Target) -> None:
    whole = target.call("POST", "/generate", {"prompt": "Hello there", **GREEDY}).json()
    reply = target.call("POST", "/generate", {"prompt": "Hello there", **GREEDY, "stream": True})
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = reply.events()
    final = events[-1]
    assert final == {
        "done": True,
        "tokens_generated": whole["tokens_generated"],
        "prompt_tokens": whole["prompt_tokens"],
        "finish_reason": whole["finish_reason"],
    }
    assert "".join(e["text"] for e in events[:-1]) == whole["generated_text"]


# The buffered Lambda handler answers with the whole body by design (its streaming image
# is tested in test_lambda_images.py); every streaming target is checked here.
@pytest.mark.parametrize("target", ["core", "gcf", "edge"], indirect=True)
def test_stream_arrives_while_generating(target: Target) -> None:
    """The first event reaches the client while the model is still generating."""
    body = {"prompt": "Hello", "max_new_tokens": 2000, "temperature": 0, "stream": True}
    # The tiny model makes its 2,000 tokens in a few hundred ms: over HTTP, ask for health
    # on a connection opened beforehand, so that asking takes one loopback round trip (a
    # fresh connection lost the race in CI).
    with contextlib.ExitStack() as stack:
        if isinstance(target, Http):
            client = stack.enter_context(httpx.Client(base_url=target.base_url, timeout=30))
            client.headers.update(AUTH)

            def health() -> dict[str, Any]:
                return dict(client.get("/healthz").json())
        else:

            def health() -> dict[str, Any]:
                return dict(target.call("GET", "/healthz").json())

        assert health()["active"] == 0
        with target.open_stream("/generate", body) as chunks:
            first = next(chunks)
            assert first.startswith(b"data: {")
            assert health()["active"] == 1, "the generation should still be running"
            rest = b"".join(chunks)
        assert rest.endswith(b"\n\n") and b'"done":true' in rest
        assert health()["active"] == 0


def test_stop_string(target: Target) -> None:
    full = target.call("POST", "/generate", {"prompt": "Hello there", **GREEDY}).json()
    text = full["generated_text"]
    stop = text[5:8]
    cut = target.call("POST", "/generate", {"prompt": "Hello there", **GREEDY, "stop": [stop]})
    assert cut.json()["generated_text"] == text[: text.find(stop)]
    assert cut.json()["finish_reason"] == "stop"


def test_seed_determinism(target: Target) -> None:
    body = {"prompt": "Edge boards", "max_new_tokens": 16, "temperature": 1.0, "seed": 42}
    first = target.call("POST", "/generate", body).json()
    second = target.call("POST", "/generate", body).json()
    other = target.call("POST", "/generate", {**body, "seed": 43}).json()
    assert first == second
    assert first["generated_text"] != other["generated_text"]


# -- OpenAI-compatible ----------------------------------------------------------------


def test_top_k_at_or_above_the_vocabulary_keeps_every_token(target: Target) -> None:
    """The tiny model's vocabulary is 512: a larger top_k means "no limit", as 0 does."""
    body = {"prompt": "Edge boards", "max_new_tokens": 16, "temperature": 1.0, "seed": 7}
    unlimited = target.call("POST", "/generate", {**body, "top_k": 0}).json()
    for top_k in (512, 513, 100000):
        reply = target.call("POST", "/generate", {**body, "top_k": top_k})
        assert reply.status == 200, reply.body
        assert reply.json() == unlimited


def test_the_playground_and_its_scripts_ship_with_every_target(target: Target) -> None:
    """Each target's bundle carries the page and its vendored scripts, served without a
    key, byte for byte."""
    vendor = Path(playground.__file__).parent / "vendor"
    page = target.call("GET", "/", headers={"authorization": ""})
    assert page.status == 200 and page.body.startswith(b"<!doctype html>")
    for route, name in playground.ASSETS.items():
        reply = target.call("GET", route, headers={"authorization": ""})
        assert reply.status == 200, (route, reply.body[:200])
        assert reply.headers["content-type"] == "text/javascript; charset=utf-8"
        assert reply.body == (vendor / name).read_bytes()


def test_top_k_on_the_openai_routes(target: Target) -> None:
    """top_k (vLLM's and llama-server's extension, the playground's control) reaches the
    sampler: at top_k 1 any seed samples the greedy answer; without it, sampling differs."""
    chat = {"messages": [{"role": "user", "content": "Edge boards"}], "max_tokens": 16}

    def text(path: str, body: dict[str, Any]) -> str:
        reply = target.call("POST", path, body)
        assert reply.status == 200, reply.body
        choice = reply.json()["choices"][0]
        return str(choice["message"]["content"] if "message" in choice else choice["text"])

    greedy = text("/v1/chat/completions", {**chat, "temperature": 0})
    for seed in (1, 2):
        sampled = {**chat, "temperature": 1.0, "seed": seed}
        assert text("/v1/chat/completions", {**sampled, "top_k": 1}) == greedy
    assert text("/v1/chat/completions", {**chat, "temperature": 1.0, "seed": 1}) != greedy
    completion = {"prompt": "Edge boards", "max_tokens": 16}
    greedy = text("/v1/completions", {**completion, "temperature": 0})
    assert text("/v1/completions", {**completion, "temperature": 1.0, "top_k": 1}) == greedy


def test_models(target: Target) -> None:
    body = target.call("GET", "/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["ortserve/tiny-llama-random-weights"]
    assert body["data"][0]["object"] == "model"
    # The context (vLLM's max_model_len) and the operator's limit (MAX_NEW_TOKENS 2000).
    assert (body["data"][0]["max_model_len"], body["data"][0]["max_tokens"]) == (2048, 2000)
    # The sampling a request that sends none gets: the random model's own (greedy).
    assert body["data"][0]["sampling"] == {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "repetition_penalty": 1.0,
        "origin": "generation_config.json",
    }


def test_completion(target: Target) -> None:
    reply = target.call(
        "POST",
        "/v1/completions",
        {
            "model": "ortserve/tiny-llama-random-weights",
            "prompt": "Hi",
            "max_tokens": 8,
            "temperature": 0,
        },
    )
    body = reply.json()
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] in {"stop", "length"}
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_chat_and_its_stream_with_usage(target: Target) -> None:
    request = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0}
    whole = target.call("POST", "/v1/chat/completions", request).json()
    assert whole["object"] == "chat.completion"
    message = whole["choices"][0]["message"]
    assert message["role"] == "assistant"
    streamed = {**request, "stream": True, "stream_options": {"include_usage": True}}
    reply = target.call("POST", "/v1/chat/completions", streamed)
    events = reply.events()
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == message["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert chunks[-1]["choices"] == []

    def counts(usage: dict[str, Any]) -> dict[str, Any]:  # the prompt cache held this one
        return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}

    assert counts(chunks[-1]["usage"]) == counts(whole["usage"])
    cached = chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 <= cached < whole["usage"]["prompt_tokens"]
    assert len({c["id"] for c in chunks}) == 1


def test_max_completion_tokens(target: Target) -> None:
    body = target.call(
        "POST",
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "max_completion_tokens": 3,
            "temperature": 0,
            "stop": None,
        },
    ).json()
    assert body["usage"]["completion_tokens"] <= 3


def test_response_format_json_schema_and_object(target: Target) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}},
        "required": ["city"],
        "additionalProperties": False,
    }
    for seed in (1, 2):
        body = target.call(
            "POST",
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "Where?"}],
                "max_tokens": 60,
                "seed": seed,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "place", "schema": schema},
                },
            },
        ).json()
        jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), schema)
    # Any object: a random model rarely closes its first key, so check the constraint's
    # start and, when it finished, the whole.
    body = target.call(
        "POST",
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "JSON"}],
            "max_tokens": 20,
            "seed": 3,
            "response_format": {"type": "json_object"},
        },
    ).json()
    content = body["choices"][0]["message"]["content"]
    assert content.startswith('{"')
    if body["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(content), dict)


def test_regex_classes_mean_what_json_schema_says(target: Target) -> None:
    """`\\d` and `\\w` are ECMA-262's ASCII classes in guided_regex and in JSON schema
    patterns (llguidance's Unicode `\\d` made `\\d{1,20}` a 400 on a byte vocabulary)."""
    body = {"prompt": "Year:", "max_new_tokens": 12, "seed": 1, "guided_regex": r"\d{1,12}"}
    reply = target.call("POST", "/generate", body)
    assert reply.status == 200, reply.body
    assert re.fullmatch("[0-9]{1,12}", reply.json()["generated_text"]), reply.json()
    schema = {
        "type": "object",
        "properties": {"id": {"type": "string", "pattern": r"^\w\d$"}},
        "required": ["id"],
        "additionalProperties": False,
    }
    reply = target.call(
        "POST",
        "/generate",
        {"prompt": "id?", "max_new_tokens": 16, "seed": 2, "guided_json": schema},
    )
    assert reply.status == 200, reply.body
    text = reply.json()["generated_text"]
    assert re.fullmatch(r'\{"id":"[A-Za-z0-9_][0-9]"\}', text), text


def test_generate_guided_regex_grammar_and_json(target: Target) -> None:
    """/generate's constrained decoding (vLLM's field names), on every target."""
    body = {"prompt": "Code:", "max_new_tokens": 20, "seed": 1, "guided_regex": "[A-Z]{3}-[0-9]{2}"}
    reply = target.call("POST", "/generate", body).json()
    assert re.fullmatch("[A-Z]{3}-[0-9]{2}", reply["generated_text"]), reply
    assert reply["finish_reason"] == "stop"
    grammar = 'start: "yes" | "no"'
    reply = target.call(
        "POST", "/generate", {**body, "guided_regex": None, "guided_grammar": grammar}
    ).json()
    assert reply["generated_text"] in {"yes", "no"}, reply
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    reply = target.call(
        "POST",
        "/generate",
        {"prompt": "n?", "max_new_tokens": 30, "seed": 2, "guided_json": schema},
    ).json()
    if reply["finish_reason"] == "stop":
        jsonschema.validate(json.loads(reply["generated_text"]), schema)
    else:  # a random model may count digits past the limit: the start still obeys
        assert reply["generated_text"].startswith('{"n":'), reply
    both = target.call("POST", "/generate", {**body, "guided_grammar": grammar})
    assert "at most one of" in str(_error(both, 400)["message"])
    bad = target.call("POST", "/generate", {**body, "guided_regex": "[unclosed"})
    assert str(_error(bad, 400)["message"]).startswith("invalid guidance")
    # A valid regex this model's tokens cannot spell out (found by the fuzz test: og
    # fails mid-generation on it): the request's error, a 400, not a 500.
    unspellable = target.call("POST", "/generate", {**body, "guided_regex": "\u0800"})
    assert "cannot be followed" in str(_error(unspellable, 400)["message"])


def test_logprobs_chat_and_completions(target: Target) -> None:
    """OpenAI's log probabilities: greedy tokens are their position's most likely token,
    the bytes spell the text, a stream carries the same entries as the whole answer."""
    chat = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    whole = target.call("POST", "/v1/chat/completions", chat).json()["choices"][0]
    content = whole["logprobs"]["content"]
    assert len(content) == 8 and whole["logprobs"]["refusal"] is None
    for entry in content:
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        best = entry["top_logprobs"][0]
        assert (best["token"], best["logprob"]) == (entry["token"], entry["logprob"])
        assert [t["logprob"] for t in entry["top_logprobs"]] == sorted(
            (t["logprob"] for t in entry["top_logprobs"]), reverse=True
        )
    spelled = bytes(b for entry in content for b in entry["bytes"])
    assert spelled.decode("utf-8", "replace") == whole["message"]["content"]
    events = target.call("POST", "/v1/chat/completions", {**chat, "stream": True}).events()
    streamed = [
        e
        for ev in events
        if isinstance(ev, dict) and ev.get("choices")
        for e in (ev["choices"][0]["logprobs"] or {"content": []})["content"]
    ]
    assert streamed == content
    assert target.call("POST", "/v1/chat/completions", {**chat, "logprobs": False}).status == 400
    plain = target.call(
        "POST", "/v1/chat/completions", {**chat, "logprobs": None, "top_logprobs": None}
    ).json()
    assert plain["choices"][0]["logprobs"] is None
    completion = {"prompt": "Hello", "max_tokens": 5, "temperature": 0, "logprobs": 2}
    legacy = target.call("POST", "/v1/completions", completion).json()
    choice = legacy["choices"][0]["logprobs"]
    assert len(choice["tokens"]) == len(choice["token_logprobs"]) == 5
    assert all(len(top) == 2 for top in choice["top_logprobs"])
    assert choice["text_offset"][0] == 0 and choice["text_offset"] == sorted(choice["text_offset"])


def test_n_choices(target: Target) -> None:
    """OpenAI's `n`: several choices, decoded side by side; with a seed, choice i is the
    request with seed + i, so each is reproducible; streamed with each choice's index."""
    chat = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 6,
        "temperature": 0.9,
        "seed": 11,
    }
    whole = target.call("POST", "/v1/chat/completions", {**chat, "n": 3}).json()
    texts = [c["message"]["content"] for c in whole["choices"]]
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2] and len(set(texts)) == 3
    for i, text in enumerate(texts):
        alone = target.call("POST", "/v1/chat/completions", {**chat, "seed": 11 + i}).json()
        assert alone["choices"][0]["message"]["content"] == text
    counts = [
        target.call("POST", "/v1/chat/completions", {**chat, "seed": 11 + i}).json()["usage"][
            "completion_tokens"
        ]
        for i in range(3)
    ]
    assert whole["usage"]["completion_tokens"] == sum(counts)
    stream = {**chat, "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    events = target.call("POST", "/v1/chat/completions", stream).events()
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    assert usage["prompt_tokens"] == whole["usage"]["prompt_tokens"]  # the prompt once
    assert usage["completion_tokens"] == sum(counts[:2])
    for index in (0, 1):
        mine = [e["choices"][0] for e in events[:-2] if e["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert mine[-1]["finish_reason"] in {"stop", "length"}
        assert "".join(c["delta"].get("content", "") for c in mine) == texts[index]
    twice = {"prompt": "Hello", "max_tokens": 4, "n": 2, "temperature": 0}
    completions = target.call("POST", "/v1/completions", twice).json()
    greedy = [c["text"] for c in completions["choices"]]
    assert len(greedy) == 2 and greedy[0] == greedy[1]  # greedy: the same choice twice
    too_many = target.call("POST", "/v1/chat/completions", {**chat, "n": 9})
    assert _error(too_many, 400)["param"] == "n"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


def test_tool_calls(target: Target) -> None:
    """OpenAI's tools: a required (or named) call is constrained to a valid call, sent as
    message.tool_calls with finish_reason tool_calls, streamed as delta.tool_calls; the
    result goes back as a tool message; mistakes are 400s."""
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    body = {
        "messages": ask,
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": 60,
        "seed": 1,
    }
    choice = target.call("POST", "/v1/chat/completions", body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    parameters = WEATHER["function"]["parameters"]  # type: ignore[index]
    jsonschema.validate(json.loads(call["function"]["arguments"]), parameters)
    named = {
        **body,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "stream": True,
    }
    deltas = [
        e["choices"][0]["delta"]
        for e in target.call("POST", "/v1/chat/completions", named).events()
        if isinstance(e, dict) and e.get("choices")
    ]
    parts = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert parts[0]["function"]["name"] == "get_weather" and parts[0]["id"].startswith("call_")
    streamed = "".join(p["function"]["arguments"] for p in parts)
    assert streamed == call["function"]["arguments"]  # the same constraint, the same seed
    result = {"role": "tool", "tool_call_id": call["id"], "content": "18 C, sunny"}
    follow = [*ask, {"role": "assistant", "content": None, "tool_calls": [call]}, result]
    after = {"messages": follow, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 8}
    message = target.call("POST", "/v1/chat/completions", after).json()["choices"][0]["message"]
    assert message["content"] and "tool_calls" not in message
    lone = target.call("POST", "/v1/chat/completions", {"messages": ask, "tool_choice": "auto"})
    assert _error(lone, 400)["param"] == "tool_choice"
    other = {**body, "tool_choice": {"type": "function", "function": {"name": "nope"}}}
    assert _error(target.call("POST", "/v1/chat/completions", other), 400)["param"] == (
        "tool_choice"
    )


def test_tool_arguments_take_only_declared_properties(target: Target) -> None:
    """A tool whose parameters leave objects open (no additionalProperties) gets calls
    with the declared properties only, unless the function says `strict: false`: a
    small model allowed more keys keeps adding them (#26 item 11)."""
    parameters = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
    }
    function: dict[str, Any] = {"name": "get_weather", "parameters": parameters}

    def calls(strict: bool | None) -> list[dict[str, Any] | None]:
        given = function if strict is None else {**function, "strict": strict}
        body = {
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [{"type": "function", "function": given}],
            "tool_choice": "required",
            "max_tokens": 80,
            "temperature": 1.5,
            "seed": 3,
            "n": 8,
        }
        choices = target.call("POST", "/v1/chat/completions", body).json()["choices"]
        found = [c["message"].get("tool_calls") for c in choices]
        return [json.loads(c[0]["function"]["arguments"]) if c else None for c in found]

    for strict in (None, True):
        assert all(call is not None and set(call) == {"city"} for call in calls(strict))
    # strict: false keeps the open object: this model then wanders past `city` (more keys
    # until max_tokens, no call) in some of the same sampled choices.
    assert any(call is None or set(call) != {"city"} for call in calls(False))


def test_ollama_routes(target: Target) -> None:
    """Ollama's API on every target: NDJSON streams that add up to the whole answer,
    the model routes, and errors in Ollama's shape."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "options": {"temperature": 0, "num_predict": 10},
    }
    whole = target.call("POST", "/api/chat", {**body, "stream": False})
    assert whole.status == 200 and whole.headers["content-type"] == "application/json"
    answer = whole.json()
    assert answer["done"] and answer["eval_count"] <= 10
    streamed = target.call("POST", "/api/chat", body)  # Ollama streams by default
    assert streamed.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in streamed.body.splitlines()]
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    text = "".join(line["message"]["content"] for line in lines)
    assert text == answer["message"]["content"]
    assert lines[-1]["done_reason"] == answer["done_reason"]
    raw = {
        "model": MODEL,
        "prompt": "Hi",
        "stream": False,
        "raw": True,
        "options": {"num_predict": 4},
    }
    generated = target.call("POST", "/api/generate", raw).json()
    assert generated["done"] and generated["eval_count"] <= 4
    assert target.call("GET", "/api/tags").json()["models"][0]["name"] == MODEL
    assert target.call("POST", "/api/show", {"model": MODEL}).json()["details"]["format"] == "onnx"
    assert "version" in target.call("GET", "/api/version").json()
    missing = target.call("POST", "/api/chat", {**body, "model": "llama3"})
    assert missing.status == 404 and "not found" in missing.json()["error"]
    bad = target.call("POST", "/api/generate", {"model": MODEL, "prompt": "x", "images": ["a"]})
    assert bad.status == 400 and isinstance(bad.json()["error"], str)


def test_ollama_conventions(target: Target, reference: Target) -> None:
    """Ollama's load and unload requests (200 at once, one JSON object), /api/ps, tools on
    /api/chat (calls as message.tool_calls, streamed in one line before the last), and
    images refused in words; the same on every target (#26 item 9)."""
    empties: list[tuple[str, dict[str, Any]]] = [
        ("/api/generate", {}),
        ("/api/chat", {"messages": []}),
    ]
    for path, empty in empties:
        field = "response" if path == "/api/generate" else "message"
        for keep_alive, reason in (
            (None, "load"),
            (0, "unload"),
            ("0s", "unload"),
            (-1, "load"),
            ("-1m", "load"),
            (0.5, "load"),
        ):
            reply = target.call("POST", path, {"model": MODEL, "keep_alive": keep_alive, **empty})
            assert reply.status == 200 and reply.headers["content-type"] == "application/json"
            body = reply.json()
            assert body["done"] is True and body["done_reason"] == reason, (keep_alive, body)
            assert body[field] in ("", {"role": "assistant", "content": ""})
        missing = target.call("POST", path, {"model": "llama3", **empty})
        assert missing.status == 404 and "not found" in missing.json()["error"]
        # Its options are checked as a generation's (the fuzz test's ST201): MAX_NEW_TOKENS.
        over = {"model": MODEL, "options": {"num_predict": 2001}, **empty}
        refused = target.call("POST", path, over)
        assert refused.status == 400 and "num_predict 2001" in refused.json()["error"]
        for wrong in ("5 minutes", "-1"):  # a string is a Go duration, with its unit
            bad = target.call("POST", path, {"model": MODEL, "keep_alive": wrong, **empty})
            assert bad.status == 400 and "keep_alive" in bad.json()["error"]
    ps = target.call("GET", "/api/ps").json()
    (running,) = ps["models"]
    listed = target.call("GET", "/api/tags").json()["models"][0]
    assert {k: running[k] for k in ("name", "model", "size", "digest", "details")} == {
        k: listed[k] for k in ("name", "model", "size", "digest", "details")
    }
    assert running["expires_at"] > "2300" and running["size_vram"] == 0
    assert running["context_length"] > 0
    assert "/api/ps" in target.call("GET", "/openapi.json").json()["paths"]
    assert set(running) == {
        "name",
        "model",
        "size",
        "digest",
        "details",
        "expires_at",
        "size_vram",
        "context_length",
    }
    ask = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER],
        "format": _OLLAMA_CALL,
        "options": {"seed": 1, "num_predict": 120},
    }
    whole = target.call("POST", "/api/chat", {**ask, "stream": False}).json()
    (call,) = whole["message"]["tool_calls"]
    assert whole["message"]["content"] == "" and call["function"]["name"] == "get_weather"
    jsonschema.validate(call["function"]["arguments"], _OLLAMA_CALL["properties"]["arguments"])  # type: ignore[index]
    lines = [json.loads(line) for line in target.call("POST", "/api/chat", ask).body.splitlines()]
    assert [line["done"] for line in lines] == [False, True]
    assert lines[0]["message"] == whole["message"] and lines[1]["message"]["content"] == ""
    assert _normalized_ollama(whole) == _normalized_ollama(
        reference.call("POST", "/api/chat", {**ask, "stream": False}).json()
    )
    no_call = target.call("POST", "/api/chat", {**ask, "format": None, "stream": False}).json()
    assert "tool_calls" not in no_call["message"] and no_call["message"]["content"]
    for path, body in (
        ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}),
        ("/api/generate", {"prompt": "x", "images": ["aGk="]}),
    ):
        refused = target.call("POST", path, {"model": MODEL, **body})
        assert refused.status == 400 and "this model takes no images" in refused.json()["error"]


_OLLAMA_CALL = {
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
        },
    },
    "required": ["name", "arguments"],
}


def _normalized_ollama(body: dict[str, Any]) -> dict[str, Any]:
    """An Ollama answer without its timestamp and durations."""
    return {k: v for k, v in body.items() if k != "created_at" and not k.endswith("duration")}


def test_generate_beam_search(target: Target) -> None:
    """/generate's num_beams: og's beam search, deterministic, the text whole at the end;
    stop strings still cut it; no guidance with it."""
    body = {"prompt": "Serverless functions", "max_new_tokens": 12, "num_beams": 4}
    first = target.call("POST", "/generate", body).json()
    again = target.call("POST", "/generate", {**body, "temperature": 1.5, "seed": 9}).json()
    assert first["generated_text"] == again["generated_text"]  # sampling knobs do not apply
    greedy = target.call("POST", "/generate", {**body, "num_beams": 1}).json()
    assert 0 < first["tokens_generated"] <= 12 and greedy["tokens_generated"] > 0
    events = target.call("POST", "/generate", {**body, "stream": True}).events()
    assert "".join(e.get("text", "") for e in events) == first["generated_text"]
    cut = first["generated_text"][3:6]
    if cut:
        stopped = target.call("POST", "/generate", {**body, "stop": [cut]}).json()
        assert (
            stopped["generated_text"]
            == first["generated_text"][: first["generated_text"].index(cut)]
        )
    guided = target.call("POST", "/generate", {**body, "guided_regex": "[a-z]+"})
    assert "beam search" in str(_error(guided, 400)["message"])


def test_same_bytes_as_the_reference(target: Target, reference: Target) -> None:
    """Parity: every target answers like the core itself, streamed bytes included."""
    requests = [
        ("/generate", {"prompt": "Parity", **GREEDY}),
        ("/generate", {"prompt": "Parity", **GREEDY, "stream": True}),
        ("/v1/completions", {"prompt": "Parity", "max_tokens": 10, "temperature": 0}),
        (
            "/v1/chat/completions",
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


# -- the token limit: the model's context, unless the operator sets one -------------------

CONTEXT = 2048  # the tiny model's context_length (genai_config.json)


@pytest.fixture(scope="module", params=TARGETS)
def unlimited(
    request: pytest.FixtureRequest, tiny_gcf_bundle: Path, tiny_model_dir: Path
) -> Iterator[Target]:
    """Each target without MAX_NEW_TOKENS (0, the default: the model's context)."""
    with open_target(request.param, tiny_model_dir, tiny_gcf_bundle, max_new_tokens=0) as target:
        yield target


def test_the_default_limit_is_the_context(unlimited: Target) -> None:
    """What clients send (1k-4k tokens) is served; past the context it is cut to what fits
    after the prompt (finish_reason length), as llama-server and Ollama do."""
    card = unlimited.call("GET", "/v1/models").json()["data"][0]
    assert (card["max_model_len"], card["max_tokens"]) == (CONTEXT, CONTEXT)
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4000, "ignore_eos": True}
    reply = unlimited.call("POST", "/v1/chat/completions", chat)
    assert reply.status == 200, reply.body
    usage = reply.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == CONTEXT
    assert reply.json()["choices"][0]["finish_reason"] == "length"
    body = {"prompt": "Hi", "max_new_tokens": 2000, "ignore_eos": True}
    generated = unlimited.call("POST", "/generate", body).json()
    assert generated["tokens_generated"] == 2000 and generated["finish_reason"] == "length"
    ollama = {
        "model": MODEL,
        "prompt": "Hi",
        "stream": False,
        "options": {"num_predict": 1000, "temperature": 0},
    }
    answer = unlimited.call("POST", "/api/generate", ollama)
    assert answer.status == 200, answer.body
    assert 0 < answer.json()["eval_count"] <= 1000
    # Without a limit, OpenAI's chat "as many as fit" is the server's default (512).
    default = unlimited.call("POST", "/v1/chat/completions", {**chat, "max_tokens": None})
    assert default.json()["usage"]["completion_tokens"] == 512
    # A minimum past the context cannot be met: a clear 400.
    least = {"prompt": "Hi", "min_tokens": CONTEXT + 1}
    error = _error(unlimited.call("POST", "/generate", least), 400, "invalid_request")
    assert error["param"] == "min_tokens" and f"limit of {CONTEXT}" in str(error["message"])


# /api/show's sampling defaults of the random model (its own: greedy, no penalty).
GREEDY_PARAMETERS = {"temperature": "0.0", "top_p": "1.0", "top_k": "0", "repeat_penalty": "1.0"}


def test_ollama_show_says_the_context_and_the_limit(unlimited: Target) -> None:
    show = unlimited.call("POST", "/api/show", {"model": MODEL}).json()
    assert show["model_info"]["onnx.context_length"] == CONTEXT
    assert show["model_info"]["ortserve.max_new_tokens"] == CONTEXT
    parameters = dict(line.split() for line in show["parameters"].splitlines())
    assert parameters == {"num_ctx": str(CONTEXT), "num_predict": "512", **GREEDY_PARAMETERS}


def test_the_operators_limit_is_a_clear_400(target: Target) -> None:
    """MAX_NEW_TOKENS (2000 here) caps every route, whatever the context leaves."""
    for path, body, field in (
        ("/v1/chat/completions", {**_CHAT, "max_tokens": 2001}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 2001}, "max_tokens"),
        ("/generate", {"prompt": "x", "max_new_tokens": 2001}, "max_new_tokens"),
    ):
        error = _error(target.call("POST", path, body), 400, "invalid_request")
        assert error["param"] == field
        assert error["message"] == f"{field} 2001 is above this server's limit of 2000"
    # min_tokens above it is refused too, with ignore_eos as without (schemathesis found
    # it accepted beside ignore_eos, which made the request's minimum its own limit).
    for ignore_eos in (False, True):
        for path, body in (
            ("/v1/completions", {"prompt": "x", "max_tokens": 4}),
            ("/generate", {"prompt": "x", "max_new_tokens": 4}),
        ):
            too_many = {**body, "min_tokens": 2001, "ignore_eos": ignore_eos}
            error = _error(target.call("POST", path, too_many), 400, "invalid_request")
            assert error["param"] == "min_tokens", (path, ignore_eos)
            assert error["message"] == "min_tokens 2001 is above this server's limit of 2000"
    ollama = {"model": MODEL, "prompt": "x", "stream": False, "options": {"num_predict": 2001}}
    refused = target.call("POST", "/api/generate", ollama)
    assert refused.status == 400 and "limit of 2000" in refused.json()["error"]
    show = target.call("POST", "/api/show", {"model": MODEL}).json()
    assert show["model_info"]["ortserve.max_new_tokens"] == 2000
    parameters = dict(line.split() for line in show["parameters"].splitlines())
    assert parameters == {"num_ctx": str(CONTEXT), "num_predict": "2000", **GREEDY_PARAMETERS}


# -- errors, auth, limits ---------------------------------------------------------------


def test_malformed_json(target: Target) -> None:
    error = _error(target.call("POST", "/v1/completions", raw=b"{not json"), 400)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/generate", {"prompt": 3}, "prompt"),
        ("/generate", {"prompt": "x", "max_new_tokens": -1}, "max_new_tokens"),
        ("/generate", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 10**9}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "temperature": "hot"}, "temperature"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, None),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 9}, "n"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 5000}, "max_tokens"),
    ],
)
def test_invalid_values(target: Target, path: str, body: object, param: str | None) -> None:
    error = _error(target.call("POST", path, body), 400, "invalid_request")
    if param is not None:
        assert str(error["param"]).startswith(param)


def test_hostile_bodies_get_a_clear_4xx(target: Target) -> None:
    # Nested deeper than Python's JSON parser goes (it recurses per level), within 64 KiB.
    deep = b'{"prompt": "x", "deep": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    _error(target.call("POST", "/generate", raw=deep), 400, "invalid_request")
    _error(target.call("POST", "/generate", raw=b'{"prompt": "\xff\xfe"}'), 400, "invalid_request")
    stops = {"prompt": "x", "stop": [f"s{i}" for i in range(5000)]}
    assert (
        _error(target.call("POST", "/generate", stops), 400, "invalid_request")["param"] == "stop"
    )
    huge = {"prompt": "x", "max_new_tokens": 10**12}
    assert _error(target.call("POST", "/generate", huge), 400)["param"] == "max_new_tokens"
    too_long = {"prompt": "hello world " * 2500, "max_new_tokens": 4}  # > the context window
    assert "context" in str(_error(target.call("POST", "/generate", too_long), 400)["message"])
    # An int past Python's 4,300-digit limit for str -> int (json.loads raises ValueError).
    seed = b'{"prompt": "x", "seed": ' + b"7" * 5000 + b"}"
    _error(target.call("POST", "/generate", raw=seed), 400, "invalid_request")
    # A lone surrogate is valid JSON but not Unicode text: the tokenizer cannot take it.
    for path, body in [
        ("/generate", b'{"prompt": "a\\ud800b"}'),
        ("/v1/completions", b'{"prompt": "a\\ud800b"}'),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}'),
    ]:
        _error(target.call("POST", path, raw=body), 400, "invalid_request")


def _nested(depth: int) -> dict[str, object]:
    """An array schema nested `depth` levels deep (built without recursion)."""
    schema: dict[str, object] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


_HUGE = {"type": "array", "minItems": 1_000_000_000}  # 8 GB in llguidance (#35 item 1)
_DEEP = _nested(500)  # a RecursionError in any recursive walk (#35 item 2)
_TOOL = {"type": "function", "function": {"name": "f", "parameters": _HUGE}}


def _chat(**extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, **extra}


def _format(schema: object) -> dict[str, object]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


@pytest.mark.parametrize(
    ("path", "body", "param", "says"),
    [
        (
            "/v1/chat/completions",
            _chat(response_format=_format(_HUGE)),
            "response_format.json_schema.schema",
            "minItems",
        ),
        (
            "/v1/chat/completions",
            _chat(response_format=_format(_DEEP)),
            "response_format.json_schema.schema",
            "nested",
        ),
        (
            "/v1/chat/completions",
            _chat(tools=[_TOOL], tool_choice="required"),
            "tools.0.function.parameters",
            "minItems",
        ),
        (
            "/v1/chat/completions",
            _chat(tools=[{**_TOOL, "function": {"name": "f", "parameters": _DEEP}}]),
            "tools.0.function.parameters",
            "nested",
        ),
        (
            "/api/chat",
            {"model": "", "messages": [{"role": "user", "content": "x"}], "format": _HUGE},
            "format",
            "minItems",
        ),
        ("/api/generate", {"model": "", "prompt": "x", "format": _DEEP}, "format", "nested"),
        ("/generate", {"prompt": "x", "guided_json": _DEEP}, "guided_json", "nested"),
        (
            "/generate",
            {"prompt": "x", "guided_json": {"type": "array", "maxItems": 10**9}},
            "guided_json",
            "maxItems",
        ),
        (
            "/generate",
            {"prompt": "x", "guided_regex": "a{1000000000}"},
            "guided_regex",
            "repetition",
        ),
        (
            "/generate",
            {"prompt": "x", "guided_grammar": "start: %json " + json.dumps(_HUGE)},
            "guided_grammar",
            "minItems",
        ),
        (
            "/generate",
            {"prompt": "x", "guided_json": {"type": "string", "pattern": "(ab){9999999}"}},
            "guided_json",
            "repetition",
        ),
    ],
)
def test_constraints_that_would_cost_the_server_are_refused_first(
    target: Target, path: str, body: dict[str, object], param: str, says: str
) -> None:
    """A schema, regex or grammar past this server's bounds is a 400 naming the field,
    before anything compiles or walks it; the server answers on (#35 items 1 and 2)."""
    reply = target.call("POST", path, body)
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    message = error["message"] if isinstance(error, dict) else error  # Ollama's is a string
    assert says in message and param in message, message
    if isinstance(error, dict):
        assert error["param"] == param
    assert target.call("GET", "/healthz").status == 200


def test_nested_tools_joined_past_the_bound_are_refused(target: Target) -> None:
    """Each tool within the bounds, the joined constraint beyond them: still a 400."""
    tools = [
        {
            "type": "function",
            "function": {"name": f"f{i}", "parameters": {"type": "array", "maxItems": 10_000}},
        }
        for i in range(6)
    ]
    reply = target.call("POST", "/v1/chat/completions", _chat(tools=tools, tool_choice="required"))
    error = _error(reply, 400, "invalid_request")
    assert error["param"] == "tools" and "add up" in str(error["message"])


@pytest.mark.parametrize(
    ("stop", "says"),
    [
        (["a", "b", "c", "d", "e"], "give at most 4 stop strings, not 5"),
        ([""], "a stop string cannot be empty"),
        ("", "a stop string cannot be empty"),
    ],
)
def test_bad_stop_strings_say_what_is_wrong(target: Target, stop: object, says: str) -> None:
    """#35 item 10: not "Input should be a valid string"."""
    for path, body in [
        ("/v1/completions", {"prompt": "x", "stop": stop}),
        ("/generate", {"prompt": "x", "stop": stop}),
    ]:
        error = _error(target.call("POST", path, body), 400, "invalid_request")
        assert error["param"] == "stop" and says in str(error["message"]), error


def test_a_minimum_length_beside_a_constraint_is_a_clear_400(target: Target) -> None:
    """og would fail inside ("compute_mask() called after stop") once the constraint is
    met and EOS is held back: refused first, naming the field (#35 item 10)."""
    chat = _chat(min_tokens=10, response_format={"type": "json_object"})
    generate = {"prompt": "x", "guided_regex": "[a-z]{3}", "ignore_eos": True}
    for path, body in [("/v1/chat/completions", chat), ("/generate", generate)]:
        error = _error(target.call("POST", path, body), 400, "invalid_request")
        assert error["param"] == "min_tokens" and "constrained" in str(error["message"])
        assert "compute_mask" not in str(error["message"])


def test_json_array_body(target: Target) -> None:
    _error(target.call("POST", "/generate", [1, 2]), 400, "invalid_request")


def test_fields_the_clients_send_are_accepted(target: Target) -> None:
    """Fields of OpenAI's and Ollama's clients that ortserve does not use are accepted."""
    openai_fields = {"user": "u", "store": True, "metadata": {"a": "b"}}
    # The penalties at 0, as clients send them by default (Responses has none).
    penalties = {"frequency_penalty": 0, "presence_penalty": 0, "logit_bias": {}}
    reply = target.call(
        "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2, **openai_fields, **penalties}
    )
    assert reply.status == 200, reply.body
    reply = target.call(
        "POST", "/v1/responses", {"input": "x", "max_output_tokens": 2, **openai_fields}
    )
    assert reply.status == 200, reply.body
    options = {"num_predict": 2, "num_ctx": 4096, "mirostat": 0}
    ollama = {"model": "", "prompt": "x", "stream": False, "keep_alive": "5m", "options": options}
    reply = target.call("POST", "/api/generate", ollama)
    assert reply.status == 200, reply.body


_CHAT_IN = {"messages": [{"role": "user", "content": "Hi"}]}


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        (
            "/generate",
            {"prompt": "x", "max_new_token": 5},
            "max_new_token: did you mean max_new_tokens?",
        ),
        ("/v1/completions", {"prompt": "x", "max_token": 5}, "max_token: did you mean max_tokens?"),
        (
            "/v1/chat/completions",
            {**_CHAT_IN, "max_token": 5},
            "max_token: did you mean max_tokens?",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "contents": "Hi"}]},
            "messages.0.contents: did you mean content?",
        ),
        (
            "/v1/responses",
            {"input": "x", "max_tokens": 5},
            "max_tokens: did you mean max_output_tokens?",
        ),
        (
            "/api/generate",
            {"model": "", "prompt": "x", "options": {"num_predcit": 5}},
            "options.num_predcit: did you mean num_predict?",
        ),
        ("/api/chat", {"model": "", **_CHAT_IN, "whatever": 1}, "unknown field whatever"),
    ],
)
def test_an_unknown_field_is_a_400_that_names_the_nearest(
    target: Target, path: str, body: object, says: str
) -> None:
    reply = target.call("POST", path, body)
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    message = error if path.startswith("/api/") else error["message"]
    assert message.startswith("unknown field ") and message.endswith(says), message


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            "messages.0.content.0",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "x"},
                            {"type": "input_image", "image_url": "x"},
                        ],
                    }
                ]
            },
            "messages.0.content.1",
        ),
        (
            "/v1/responses",
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content.0",
        ),
    ],
)
def test_an_image_is_one_clear_400_on_every_route(
    target: Target, path: str, body: dict[str, object], param: str
) -> None:
    error = _error(target.call("POST", path, body), 400, "invalid_request")
    assert error["message"] == f"{param}: this model takes no images"
    assert error["param"] == param
    reply = target.call(
        "POST",
        "/api/chat",
        {"model": "", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
    )
    assert reply.status == 400 and reply.json()["error"].endswith("this model takes no images")


def test_unknown_model(target: Target) -> None:
    _error(
        target.call("POST", "/v1/completions", {"model": "gpt-4", "prompt": "x"}),
        404,
        "model_not_found",
    )


def test_oversize_body(target: Target) -> None:
    _error(target.call("POST", "/generate", {"prompt": "x" * 70_000}), 413, "payload_too_large")


def test_a_path_is_matched_as_sent(target: Target) -> None:
    """`//v1/models` is not `/v1/models` on any target (werkzeug merged the slashes)."""
    if isinstance(target, Http):  # httpx would read "//v1" as a host: send it raw
        url = urllib.parse.urlsplit(target.base_url)
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
        conn.request("GET", "//v1/models", headers=AUTH)
        status = conn.getresponse().status
        conn.close()
    else:
        status = target.call("GET", "//v1/models").status
    assert status == 404


def test_unknown_route_and_method(target: Target) -> None:
    error = _error(target.call("GET", "/v2/nothing"), 404, "not_found")
    assert error["message"] == "no route /v2/nothing"
    # An OpenAI client whose base_url lacks /v1: the 404 says where the route is.
    error = _error(target.call("POST", "/chat/completions", _CHAT), 404, "not_found")
    assert error["message"] == (
        "no route /chat/completions: did you mean /v1/chat/completions? "
        "(an OpenAI client's base_url ends with /v1)"
    )
    reply = target.call("GET", "/v1/chat/completions")
    _error(reply, 405, "method_not_allowed")
    assert reply.headers["allow"] == "OPTIONS, POST"


def test_without_a_key_routes_cannot_be_discovered(target: Target) -> None:
    """The key is checked before the route: an unknown route and a wrong method answer 401
    as a real route does (with the key: 404 and 405, above), and a preflight without a
    key is answered alike on every path; the public routes stay open."""
    nokey = {"authorization": ""}
    for method, path in (
        ("GET", "/v2/nothing"),
        ("GET", "/v1/chat/completions"),
        ("DELETE", "/v1/models"),
        ("GET", "/v1/models"),
    ):
        _error(target.call(method, path, headers=nokey), 401, "invalid_api_key")
    preflights = [
        target.call("OPTIONS", path, headers=nokey)
        for path in ("/v2/nothing", "/v1/chat/completions")
    ]
    assert [r.status for r in preflights] == [204, 204]
    assert preflights[0].headers["allow"] == preflights[1].headers["allow"]
    assert target.call("GET", "/healthz", headers=nokey).status == 200


@pytest.mark.parametrize(
    "headers",
    [{"authorization": ""}, {"authorization": "Bearer wrong"}, {"authorization": "Basic x"}],
)
def test_missing_or_wrong_key(target: Target, headers: dict[str, str]) -> None:
    _error(target.call("GET", "/v1/models", headers=headers), 401, "invalid_api_key")


def test_every_key_and_both_headers_work(target: Target) -> None:
    other = {"authorization": "Bearer other-key"}
    assert target.call("GET", "/v1/models", headers=other).status == 200
    header = {"authorization": "", "x-api-key": API_KEY}
    assert target.call("GET", "/v1/models", headers=header).status == 200


def test_health_is_exempt_from_auth_and_reports_the_model(target: Target) -> None:
    for path in ("/healthz", "/readyz"):
        # Without a key (the server has keys), the status only; with one, the model.
        anyone = target.call("GET", path, headers={"authorization": ""}).json()
        assert anyone == {"status": "ready", **({"alive": True} if path == "/healthz" else {})}
        body = target.call("GET", path).json()
        assert body["status"] == "ready"
        assert body["model"] == "ortserve/tiny-llama-random-weights"
        assert body["execution_provider"] == "cpu"
        assert len(body["manifest_digest"]) == 64
        assert isinstance(body["skipped_providers"], dict)


def test_openapi_document(target: Target) -> None:
    doc = target.call("GET", "/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    assert {"/generate", "/v1/completions", "/v1/chat/completions"} <= set(doc["paths"])
    schemas = doc["components"]["schemas"]
    # It advertises only what the server accepts: its own token limit, n up to 8, no
    # echo, at most 4 stop strings; and null for an optional field (its default).
    limit = {"type": "integer", "minimum": 1, "maximum": 2000}
    assert limit in schemas["GenerateBody"]["properties"]["max_new_tokens"]["anyOf"]
    assert limit in schemas["ChatBody"]["properties"]["max_completion_tokens"]["anyOf"]
    n = schemas["ChatBody"]["properties"]["n"]["anyOf"]
    assert n == [{"type": "integer", "minimum": 1, "maximum": 8}, {"type": "null"}]
    assert schemas["CompletionBody"]["properties"]["echo"]["anyOf"][0]["const"] is False
    stop = schemas["CompletionBody"]["properties"]["stop"]["anyOf"]
    assert {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4} in stop
    assert "/v1/models/{model}" in doc["paths"]


_CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def test_null_means_the_default(target: Target) -> None:
    """The openai client sends `temperature=None` when asked: OpenAI treats it as unset."""
    nulls = {
        "temperature": None,
        "top_p": None,
        "n": None,
        "stream": None,
        "seed": None,
        "logprobs": None,
        "stop": None,
        "stream_options": None,
        "tools": None,
    }
    assert target.call("POST", "/v1/chat/completions", {**_CHAT, **nulls}).status == 200
    body = {"prompt": "x", "max_tokens": 2, "echo": None, "logprobs": None, "n": None}
    assert target.call("POST", "/v1/completions", body).status == 200
    generate = {"prompt": "x", "max_new_tokens": 2, "temperature": None, "top_k": None}
    assert target.call("POST", "/generate", generate).status == 200


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {**_CHAT, "max_tokens": "5"}, "max_tokens"),
        ("/v1/chat/completions", {**_CHAT, "max_tokens": True}, "max_tokens"),
        ("/v1/chat/completions", {**_CHAT, "stream": "yes"}, "stream"),
        ("/generate", {"prompt": "x", "temperature": "0.5"}, "temperature"),
        ("/generate", {"prompt": "x", "max_new_tokens": 5000}, "max_new_tokens"),
        ("/v1/chat/completions", {**_CHAT, "max_completion_tokens": 5000}, "max_completion_tokens"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": 3}]},
            "messages.0.content",
        ),
        ("/v1/completions", {"prompt": "x", "echo": True}, "echo"),
        ("/v1/chat/completions", {**_CHAT, "logprobs": "yes"}, "logprobs"),
        ("/v1/chat/completions", {**_CHAT, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {**_CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/completions", {"prompt": "x", "logprobs": 6}, "logprobs"),
    ],
)
def test_no_coercion_and_the_routes_own_field_names(
    target: Target, path: str, body: object, param: str
) -> None:
    assert _error(target.call("POST", path, body), 400, "invalid_request")["param"] == param


def test_the_one_model_answers_to_its_name_in_any_case_with_latest_or_none(
    target: Target,
) -> None:
    """Single-model mode (#27 item 2): `model` may be the served name in any case, with
    Ollama's `:latest`, empty or absent (llama-server's rule); another name is a 404."""
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    ollama_chat = {
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": False,
        "options": {"num_predict": 2},
    }
    for name in (None, "", MODEL.upper(), f"{MODEL}:latest", f"{MODEL.upper()}:LATEST"):
        named = {} if name is None else {"model": name}
        reply = target.call("POST", "/v1/chat/completions", {**chat, **named})
        assert reply.status == 200 and reply.json()["model"] == MODEL, (name, reply.body)
        answer = target.call("POST", "/api/chat", {**ollama_chat, "model": name or ""})
        assert answer.status == 200 and answer.json()["model"] == MODEL, (name, answer.body)
        shown = target.call("POST", "/api/show", {"model": name})
        assert shown.status == 200, (name, shown.body)
    card = target.call("GET", f"/v1/models/{MODEL.upper()}:latest")
    assert card.status == 200 and card.json()["id"] == MODEL
    for other in ("gpt-4", f"{MODEL}:fp32", "latest"):
        _error(
            target.call("POST", "/v1/chat/completions", {**chat, "model": other}),
            404,
            "model_not_found",
        )
        assert target.call("POST", "/api/chat", {**ollama_chat, "model": other}).status == 404


def test_aliases_are_listed_and_answered_to(tiny_model_dir: Path, core_api: Api) -> None:
    """ALIASES (`serve --alias`) and SERVED_NAME: the first alias is the id, every name is
    listed (/v1/models, /api/tags) and may be asked for; the manifest's name still works."""
    settings = _settings(tiny_model_dir, served_name="tiny", aliases=["gpt-4o-mini", "local"])
    target = InProcess(Api(core_api.state, settings))  # the same loaded model, other names
    names = ["gpt-4o-mini", "local", "tiny"]
    assert [m["id"] for m in target.call("GET", "/v1/models").json()["data"]] == names
    assert [m["name"] for m in target.call("GET", "/api/tags").json()["models"]] == names
    assert target.call("GET", "/v1/models/Local").json()["id"] == "local"
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    for name in ("local", "TINY:latest", MODEL, ""):
        reply = target.call("POST", "/v1/chat/completions", {**chat, "model": name})
        assert reply.status == 200 and reply.json()["model"] == "gpt-4o-mini", name
    _error(target.call("POST", "/v1/chat/completions", {**chat, "model": "gpt-4"}), 404)


def test_models_retrieve_head_and_options(target: Target) -> None:
    listed = target.call("GET", "/v1/models").json()["data"][0]
    one = target.call("GET", f"/v1/models/{listed['id']}")
    assert one.status == 200 and one.json() == listed
    _error(target.call("GET", "/v1/models/gpt-4"), 404, "model_not_found")
    for path in ("/v1/models", "/healthz", "/readyz"):
        head = target.call("HEAD", path)
        assert (head.status, head.body) == (200, b""), path
        assert head.headers["content-type"] == "application/json"
    options = target.call("OPTIONS", "/generate")
    assert options.status == 204
    assert options.headers["allow"] == "OPTIONS, POST"
    assert target.call("OPTIONS", "/v1/models").headers["allow"] == "GET, HEAD, OPTIONS"
    assert "access-control-allow-origin" not in options.headers  # CORS is off by default

"""The Responses API on every target: a kept response is
its API key's alone (another key's `previous_response_id` of it answers exactly as an id
that never was), and input items this server does not take are refused by type."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.functional.harness import Reply, Target
from tests.functional.targets import TARGETS, open_target

RESPONSES = "/v1/responses"
OTHER = {"authorization": "Bearer other-key"}  # the harness's servers' second key


@pytest.fixture(scope="module", params=TARGETS)
def target(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tiny_gcf_bundle: Path
) -> Iterator[Target]:
    with open_target(request.param, tiny_model_dir, tiny_gcf_bundle) as target:
        yield target


def _ask(target: Target, body: dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
    return target.call("POST", RESPONSES, {"max_output_tokens": 2, **body}, headers)


def _refusal(reply: Reply) -> dict[str, Any]:
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert isinstance(error, dict)
    return error


def test_another_key_cannot_continue_a_response(target: Target) -> None:
    first = _ask(target, {"input": "the secret word is plover"})
    assert first.status == 200, first.body
    kept = first.json()["id"]
    # Its own key continues it.
    assert _ask(target, {"input": "and?", "previous_response_id": kept}).status == 200
    # The other key gets what an id that never was gets: same status, same words.
    never = "resp_" + "0" * 32
    theirs = _refusal(_ask(target, {"input": "and?", "previous_response_id": kept}, OTHER))
    unknown = _refusal(_ask(target, {"input": "and?", "previous_response_id": never}, OTHER))
    assert theirs == {**unknown, "message": unknown["message"].replace(never, kept)}
    assert theirs["param"] == "previous_response_id"
    assert "send the whole conversation" in theirs["message"]
    # Streamed, as well: refused before the first byte.
    streamed = _ask(target, {"input": "x", "previous_response_id": kept, "stream": True}, OTHER)
    assert _refusal(streamed) == theirs


def test_a_streamed_response_is_kept_for_its_key_only(target: Target) -> None:
    first = _ask(target, {"input": "hello", "stream": True}, OTHER)
    assert first.status == 200, first.body
    kept = first.events()[-1]["response"]["id"]
    assert _ask(target, {"input": "more", "previous_response_id": kept}, OTHER).status == 200
    _refusal(_ask(target, {"input": "more", "previous_response_id": kept}))


@pytest.mark.parametrize(
    ("item", "says"),
    [
        (
            {"type": "reasoning", "id": "rs_1", "summary": []},
            "input.1: item type 'reasoning' is not supported here; "
            "supported: message, function_call, function_call_output",
        ),
        (
            {"type": "item_reference", "id": "msg_1"},
            "input.1: item type 'item_reference' is not supported here",
        ),
        (
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            "input.1: item type 'web_search_call' is not supported here",
        ),
        (
            {"role": "tool", "content": "42"},
            "input.1: message role 'tool' is not supported here; supported roles: user, "
            "assistant, system, developer (a tool's result is a function_call_output item)",
        ),
    ],
)
def test_an_unknown_input_item_is_named(target: Target, item: dict[str, Any], says: str) -> None:
    hello = {"role": "user", "content": "hello"}
    error = _refusal(_ask(target, {"input": [hello, item]}))
    assert error["message"].startswith(says), error
    assert error["param"] == "input.1"
    assert "valid string" not in json.dumps(error)

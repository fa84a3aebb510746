"""The Messages API's body (core.protocol.anthropic): turns and blocks as chat templates
take them, and what it refuses in words."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ortserve.core.errors import InvalidRequestError
from ortserve.core.protocol.anthropic import MessagesBody
from ortserve.core.protocol.bodies import parse


def _body(**fields: Any) -> MessagesBody:
    data = {"model": "m", "max_tokens": 8, **fields}
    return parse(MessagesBody, json.dumps(data).encode())


def test_turns_and_blocks_become_the_chat_templates_messages() -> None:
    body = _body(
        system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "no such city"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "And "},
                    {"type": "text", "text": "so?", "cache_control": {"type": "ephemeral"}},
                ],
            },
        ],
    )
    assert body.conversation() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "w", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such city"},
        {"role": "user", "content": "And so?"},
    ]


def test_the_stop_sequences_and_limits_reach_the_generation() -> None:
    body = _body(messages=[{"role": "user", "content": "Hi"}], stop_sequences=["\n\n", "END"])
    assert body.stop_sequences == ["\n\n", "END"] and body.max_tokens == 8


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_use", "id": "t", "name": "w", "input": {}}],
                    }
                ]
            },
            "tool_use blocks belong in the other role's turns",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [{"type": "image", "source": {}}],
                            }
                        ],
                    }
                ]
            },
            "this model takes no images",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "content block type 'document' is not supported here",
        ),
        (
            {"messages": [{"role": "user", "content": "Hi"}], "stop_sequences": ["a"] * 5},
            "at most 4",
        ),
        (
            {"messages": [{"role": "user", "content": "Hi"}], "stop_sequences": [""]},
            "cannot be empty",
        ),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "Hi"}]}, "messages.0.role"),
        (
            {"messages": [{"role": "user", "content": "Hi"}], "tool_choice": {"type": "tool"}},
            "needs the tool's name",
        ),
        (
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokenz": 3},
            "did you mean max_tokens",
        ),
    ],
)
def test_what_it_cannot_take_is_a_400_in_words(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidRequestError, match=words.replace("?", r"\?")):
        _body(**fields)

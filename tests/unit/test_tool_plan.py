"""Tool calls' plan (core.protocol.tools.ToolPlan) and the log-probability ledger
(core.generation.LogprobLedger): pure logic, no model (#28 item 7)."""

from __future__ import annotations

import json
from typing import Any

from ortserve.core.generation import Completion, LogprobLedger, Timings, TokenLogprob
from ortserve.core.protocol.tools import ToolPlan, family

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME: dict[str, Any] = {"type": "function", "function": {"name": "time"}}
HERMES = "{% for t in tools %}{{ t }}{% endfor %}<tool_call>"


def _done(text: str, reason: Any = "stop") -> Completion:
    return Completion(text, reason, 1, 1, Timings(0.0, 0.0, 0.0))


def test_the_family_is_the_templates() -> None:
    assert family(HERMES) == "hermes"
    assert family("{{ messages }}") == "generic"


def test_hermes_calls_are_read_from_their_tags_and_all_must_parse() -> None:
    plan = ToolPlan("hermes", [WEATHER, TIME], "auto")
    text = '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
    (call,) = plan.parse(text)
    assert (call.name, json.loads(call.arguments)) == ("weather", {"city": "Oslo"})
    assert call.id.startswith("call_") and len(call.id) == 29
    bad = text + '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
    assert plan.parse(bad) == []  # one unknown function: an answer in words, not calls
    assert plan.ending(_done(text)) == "tool_calls"
    assert plan.ending(_done(text, "length")) == "length"
    assert plan.template_tools() == [WEATHER, TIME]


def test_generic_calls_are_the_whole_text_with_string_arguments_read_too() -> None:
    plan = ToolPlan("generic", [WEATHER], "auto")
    (call,) = plan.parse(' {"name": "weather", "arguments": "{\\"city\\": \\"Rome\\"}"} ')
    assert json.loads(call.arguments) == {"city": "Rome"}
    assert plan.parse("It is sunny.") == []
    assert plan.parse('{"name": "weather", "arguments": [1]}') == []
    assert plan.template_tools() is None  # the prompt describes them instead
    messages = plan.messages([{"role": "user", "content": "hi"}])
    assert messages[0]["role"] == "system" and '"weather"' in messages[0]["content"]
    with_system = plan.messages([{"role": "system", "content": "Be brief."}])
    assert len(with_system) == 1 and with_system[0]["content"].startswith("Be brief.\n\n")


def test_required_or_a_named_function_constrains_the_output() -> None:
    assert ToolPlan("generic", [WEATHER, TIME], "auto").guidance() is None
    named = ToolPlan("generic", [WEATHER, TIME], "weather").guidance()
    assert named is not None and named.kind == "json_schema"
    schema = json.loads(named.data)
    assert schema["properties"]["name"] == {"const": "weather"}
    # Without `strict: false` the parameters' objects are closed (small models wander).
    assert schema["properties"]["arguments"]["additionalProperties"] is False
    required = ToolPlan("generic", [WEATHER, TIME], "required").guidance()
    assert required is not None and len(json.loads(required.data)["anyOf"]) == 2


def _lp(token: int) -> TokenLogprob:
    return TokenLogprob(token, -0.5, ())


def test_the_ledger_releases_a_token_once_all_its_text_is_sent() -> None:
    ledger = LogprobLedger()
    ledger.add(3, _lp(1))  # text[0:3]
    ledger.add(5, _lp(2))  # text[3:5]
    assert ledger.take(2) == []
    assert ledger.take(4) == [_lp(1)]
    ledger.extend_last(7)  # the decoder flushed the last token's final bytes
    assert ledger.take(5) == []
    assert ledger.take(7) == [_lp(2)]
    assert ledger.take(100) == []  # each token once
    assert ledger.within(3) == (_lp(1),)

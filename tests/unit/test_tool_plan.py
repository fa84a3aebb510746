"""Tool calls' plan (core.protocol.tools.ToolPlan) and the log-probability ledger
(core.generation.LogprobLedger): pure logic, no model (#28 item 7); the output rules on
calls whose arguments the server decodes twice (#49 item 7)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ortserve.core.content_filter import ContentFilter, FilterFile
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


# -- #49 item 7: the output rules see a call's arguments as the client gets them ------------

_RULES = ContentFilter(
    FilterFile.model_validate(
        {"output": {"deny_words": ["forbidden"], "redact": ["email"]}, "redaction": "[{kind}]"}
    )
)
_ARGUMENTS = {"type": "function", "function": {"name": "f"}}


def _guarded(text: str, parts: int) -> tuple[str, str]:
    """`text` through the output rules in `parts` pieces: what goes out, and the rule."""
    guard = _RULES.guard()
    size = max(1, len(text) // parts)
    out = "".join(guard.feed(text[i : i + size]) for i in range(0, len(text), size))
    return out + guard.flush(), guard.rule


@pytest.mark.parametrize("parts", [1, 7, 1000])
@pytest.mark.parametrize("family", ["generic", "hermes"])
def test_arguments_written_as_a_string_are_filtered_as_decoded(parts: int, family: Any) -> None:
    """A call whose `arguments` is a JSON string holding JSON escapes: the server decodes
    it twice (`forbid\\\\u0064en` becomes `forbidden`), so the rules do too."""
    plan = ToolPlan(family, [_ARGUMENTS], "auto")

    def call(argument: str) -> str:
        encoded = json.dumps({"name": "f", "arguments": argument})
        return f"<tool_call>{encoded}</tool_call>" if family == "hermes" else encoded

    denied = call('{"q":"forbid\\u0064en"}')
    assert "forbid\\\\u0064en" in denied  # as the model writes it
    out, rule = _guarded(denied, parts)
    assert rule == "output.deny_words" and plan.parse(out) == []
    assert "forbid" not in out
    out, rule = _guarded(call('{"q":"bob\\u0040example.com"}'), parts)
    (redacted,) = plan.parse(out)
    assert (rule, json.loads(redacted.arguments)) == ("", {"q": "[email]"})
    fine = call('{"q":"forbid\\u0064ance"}')
    (kept,) = plan.parse(_guarded(fine, parts)[0])
    assert json.loads(kept.arguments) == {"q": "forbiddance"}

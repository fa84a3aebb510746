"""ortserve.core.protocol.bounds: a constraint's cost is bounded before it is compiled or
walked (#35 items 1 and 2)."""

from __future__ import annotations

import json

import pytest

from ortserve.core.protocol.bounds import (
    MAX_ITEMS,
    MAX_SCHEMA_DEPTH,
    check_grammar,
    check_regex,
    check_schema,
)


def _nested(depth: int) -> dict[str, object]:
    schema: dict[str, object] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_depth_is_checked_without_recursion() -> None:
    check_schema(_nested(MAX_SCHEMA_DEPTH - 1))  # each level: one object
    with pytest.raises(ValueError, match="nested more than"):
        check_schema(_nested(MAX_SCHEMA_DEPTH))
    with pytest.raises(ValueError, match="nested more than"):
        check_schema(_nested(100_000))  # far past Python's recursion limit: no RecursionError


@pytest.mark.parametrize("key", ["minItems", "maxItems", "minContains", "maxContains"])
def test_item_counts_are_bounded_each_and_in_sum(key: str) -> None:
    check_schema({"type": "array", key: MAX_ITEMS})
    with pytest.raises(ValueError, match=f"{key} 1e\\+09 is above"):
        check_schema({"type": "array", key: 1e9})
    with pytest.raises(ValueError, match=key):
        check_schema({"type": "array", key: MAX_ITEMS + 1})
    many = {"anyOf": [{"type": "array", key: MAX_ITEMS} for _ in range(6)]}
    with pytest.raises(ValueError, match="add up"):
        check_schema(many)


def test_size_and_the_regexes_inside_a_schema() -> None:
    with pytest.raises(ValueError, match="too large"):
        check_schema({"enum": list(range(30_000))})
    with pytest.raises(ValueError, match="repetition"):
        check_schema({"properties": {"a": {"type": "string", "pattern": "x{0,999999999}"}}})
    with pytest.raises(ValueError, match="repetition"):
        check_schema({"patternProperties": {"^a{5000000}$": {}}})
    check_schema({"type": "string", "pattern": "^[0-9]{1,1000}$", "maxLength": 10**9})


def test_regexes_and_grammars() -> None:
    check_regex("[A-Z]{3}-[0-9]{2}")
    with pytest.raises(ValueError, match="repetition"):
        check_regex("(ab){1000000000}")
    with pytest.raises(ValueError, match="longer than"):
        check_regex("a" * 30_000)
    check_grammar('start: "a" item{2,5}\nitem: /[0-9]{3}/')
    with pytest.raises(ValueError, match="minItems"):
        check_grammar("start: %json " + json.dumps({"type": "array", "minItems": 10**9}))
    with pytest.raises(ValueError, match="not followed by JSON"):
        check_grammar("start: %json {oops")
    with pytest.raises(ValueError, match="nested"):
        check_grammar("start: %json " + "[" * 50_000 + "]" * 50_000)
    # The braces of a %json schema are JSON, not a repetition.
    check_grammar('start: %json {"type": "object"}\n')

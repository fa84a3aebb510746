"""ortserve.core.protocol.patterns: regex classes as JSON Schema (ECMA-262) means them."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ortserve.core.protocol.patterns import closed_objects, ecma_classes, ecma_schema


def test_digit_and_word_classes_are_ascii() -> None:
    assert ecma_classes(r"\d{1,1000}") == "[0-9]{1,1000}"
    assert ecma_classes(r"\D\w\W") == "[^0-9][A-Za-z0-9_][^A-Za-z0-9_]"


def test_inside_a_class_they_join_it() -> None:
    assert ecma_classes(r"[\d.]+") == "[0-9.]+"
    assert ecma_classes(r"[^\w-]") == "[^A-Za-z0-9_-]"
    assert ecma_classes(r"[\D]") == "[[^0-9]]"  # a nested class (Rust's syntax)


def test_other_escapes_are_kept() -> None:
    for pattern in (r"\\d", r"a\.b", r"\s+", r"\[\d\]", r"\u00e9", r"\p{L}"):
        assert ecma_classes(pattern).replace("[0-9]", r"\d") == pattern


def test_schemas_are_translated_wherever_a_pattern_is() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "year": {"type": "string", "pattern": r"^\d{4}$"},
            "pattern": {"type": "string"},
        },
        "patternProperties": {r"^\w+$": {"pattern": r"\d"}},
        "anyOf": [{"pattern": r"\w"}],
    }
    out = ecma_schema(schema)
    assert out["properties"]["year"]["pattern"] == "^[0-9]{4}$"
    assert out["properties"]["pattern"] == {"type": "string"}  # a property named so
    assert out["patternProperties"] == {"^[A-Za-z0-9_]+$": {"pattern": "[0-9]"}}
    assert out["anyOf"] == [{"pattern": "[A-Za-z0-9_]"}]
    assert schema["properties"]["year"]["pattern"] == r"^\d{4}$"  # the input is untouched


@given(st.text(alphabet="ab1_-. \u0663\uff10", max_size=12))
def test_the_translation_matches_as_ecma_does(text: str) -> None:
    """Python's re with ASCII flags is ECMA's \\d and \\w: the translation agrees."""
    for pattern in (r"^\d*$", r"^\w*$", r"^[\d.]*$", r"^\D*$", r"^[^\w]*$"):
        ecma = re.fullmatch(pattern, text, re.ASCII) is not None
        assert (re.fullmatch(ecma_classes(pattern), text) is not None) == ecma


def test_objects_are_closed_at_their_declared_properties() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "default": {"properties": {"x": {}}}},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
            "tags": {"type": "array", "items": {"properties": {"k": {"type": "string"}}}},
            "any": {"anyOf": [{"properties": {"a": {}}}, {"type": "string"}]},
            "open": {"type": "object", "properties": {"b": {}}, "additionalProperties": True},
            "map": {"type": "object", "additionalProperties": {"type": "number"}},
            "free": {"type": "object"},
            "both": {"allOf": [{"properties": {"c": {}}}, {"properties": {"d": {}}}]},
        },
        "$defs": {"point": {"properties": {"x": {"type": "number"}}}},
    }
    out = closed_objects(schema)
    props = out["properties"]
    assert out["additionalProperties"] is False
    assert props["where"]["additionalProperties"] is False
    assert props["tags"]["items"]["additionalProperties"] is False
    assert props["any"]["anyOf"][0]["additionalProperties"] is False
    assert out["$defs"]["point"]["additionalProperties"] is False
    assert props["open"]["additionalProperties"] is True  # the schema's own choice
    assert props["map"]["additionalProperties"] == {"type": "number"}
    assert "additionalProperties" not in props["free"]  # no properties: a free-form map
    assert all("additionalProperties" not in s for s in props["both"]["allOf"])
    assert props["city"]["default"] == {"properties": {"x": {}}}  # data, not a schema
    assert "additionalProperties" not in schema  # a copy


def test_closed_objects_refuse_what_open_ones_take() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    extra = {"city": "Paris", "country": "France"}
    jsonschema.validate(extra, schema)
    with pytest.raises(jsonschema.ValidationError, match="country"):
        jsonschema.validate(extra, closed_objects(schema))

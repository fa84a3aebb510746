"""JSON schemas and regular expressions as JSON Schema and OpenAI users write them, for
llguidance.

JSON Schema's `pattern` is an ECMA-262 regex, in which `\\d` is `[0-9]` and `\\w` is
`[A-Za-z0-9_]`; llguidance (Rust's regex syntax) reads them as Unicode classes: `\\d` then
also matches fullwidth and other digits, whose bytes a byte-level vocabulary spells with
tokens the grammar cannot take (`\\d{1,1000}` failed every time, "token doesn't satisfy the
grammar"), and a greedy `\\d+` on the real SmolLM2 wrote fullwidth zeros (U+FF10) where
`[0-9]+` writes `1999`. They are translated to their ECMA (ASCII) meaning here; `\\s`
keeps Rust's Unicode whitespace, which is ECMA's within a few rare code points.

Objects are closed at their declared properties unless the schema says otherwise
(`closed_objects`): JSON Schema leaves an object open, and a small model given the
chance keeps adding keys until its token limit (OpenAI's `strict: true` means the same).
"""

from __future__ import annotations

import copy
from typing import Any

# Outside a class: the whole class; inside one: what goes between its brackets.
_CLASSES = {"d": "0-9", "w": "A-Za-z0-9_"}


def ecma_classes(pattern: str) -> str:
    """`pattern` with `\\d`, `\\D`, `\\w` and `\\W` made ASCII classes (ECMA-262's meaning),
    inside character classes too; every other character and escape is kept as written."""
    out: list[str] = []
    depth = 0  # inside [...] (Rust's syntax nests classes)
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            escaped = pattern[i + 1]
            body = _CLASSES.get(escaped.lower())
            if body is None:
                out.append(pattern[i : i + 2])
            elif escaped.islower():
                out.append(body if depth else f"[{body}]")
            else:
                out.append(f"[^{body}]")  # a negated class nests inside a class too
            i += 2
            continue
        if char == "[":
            depth += 1
        elif char == "]" and depth:
            depth -= 1
        out.append(char)
        i += 1
    return "".join(out)


def ecma_schema(schema: Any) -> Any:
    """A copy of the JSON schema `schema` whose `pattern`s and `patternProperties` keys
    are translated by `ecma_classes`."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                node["pattern"] = ecma_classes(node["pattern"])
            properties = node.get("patternProperties")
            if isinstance(properties, dict):
                node["patternProperties"] = {ecma_classes(k): v for k, v in properties.items()}
            for key, value in node.items():
                if key != "pattern":
                    walk(value)

    walk(schema)
    return schema


# Keywords whose value is a schema, a list of schemas, or a map of names to schemas
# (JSON Schema 2020-12 and draft 7): where `closed_objects` looks for object schemas.
_SCHEMA = (
    *("additionalProperties", "items", "contains", "not", "if", "then", "else"),
    *("propertyNames", "unevaluatedProperties", "unevaluatedItems", "additionalItems"),
)
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# Any of these says what other keys an object may have: the schema's own choice, kept.
_OPENNESS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def closed_objects(schema: Any) -> Any:
    """A copy of the JSON schema `schema` in which every object schema that declares
    `properties` and says nothing of other keys gets `additionalProperties: false`.

    Members of an `allOf` are left open (each would refuse the others' properties); an
    object without `properties` (a free-form map) stays open; values that are data, not
    schemas (`const`, `enum`, `default`, `examples`), are never touched."""
    schema = copy.deepcopy(schema)

    def walk(node: Any, close: bool) -> None:
        if not isinstance(node, dict):
            return
        declared = isinstance(node.get("properties"), dict)
        if close and declared and not any(key in node for key in _OPENNESS):
            node["additionalProperties"] = False
        for key in _SCHEMA:
            walk(node.get(key), True)
        for key in _SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                for item in node[key]:
                    walk(item, True)
        for item in node.get("allOf") or []:
            walk(item, False)
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                for value in node[key].values():
                    walk(value, True)

    walk(schema, True)
    return schema

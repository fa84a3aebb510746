"""The cost of a constraint, bounded before anything compiles or walks it.

A JSON schema, regex or lark grammar from a client becomes an llguidance grammar inside
onnxruntime-genai, in the server's process. Some cost memory in proportion to a number
in them, not to their size: measured with onnxruntime-genai 0.18 (llguidance inside) on
the tiny model, `{"type": "array", "minItems": N}` takes 70 MB at N = 100,000, 1.4 GB at
10 million and aborts the process (`memory allocation of 8589934592 bytes failed`) at a
billion; `maxItems` is worse (1.2 GB at a million, the same abort at a billion); a lark
grammar's `%json {...}` embeds such a schema. A schema nested some hundreds of levels
deep overflows Python's stack in any recursive walk. So before any of that: the depth
and size of a schema are checked by an iterative walk, its item counts bounded (each,
and their sum: 5 arrays of 10,000 took 165 MB), the repetition counts of every regex
(`{n,m}`) and the size of a grammar bounded; lark grammars' `%json` schemas are checked
as schemas. Regexes themselves compile lazily (`a{1000000000}`: 145 MB), so their
bound is generous. A breach is a `ValueError` naming the bound (the protocol makes it a
400 naming the field).
"""

from __future__ import annotations

import json
import re
from typing import Any

#: How deeply a schema's JSON may nest (objects and arrays, counted from 1).
MAX_SCHEMA_DEPTH = 64
#: How many JSON values (objects, arrays, strings, numbers…) a schema may hold; 5,000
#: properties (about 10,000 values) take 1.3 s to compile.
MAX_SCHEMA_NODES = 20_000
#: The largest item count one array keyword may give.
MAX_ITEMS = 10_000
#: The largest sum of the item counts in one schema.
MAX_ITEMS_TOTAL = 50_000
#: Keywords whose number becomes that many grammar symbols.
COUNT_KEYWORDS = ("minItems", "maxItems", "minContains", "maxContains")
#: The largest repetition count (`{n}`, `{n,}`, `{n,m}`) in a regex or grammar.
MAX_REPEAT = 100_000
#: The longest regex (characters).
MAX_PATTERN_CHARS = 20_000
#: The longest lark grammar (characters).
MAX_GRAMMAR_CHARS = 200_000

_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_JSON_DIRECTIVE = re.compile(r"%json\s*")


def check_schema(schema: Any) -> None:
    """Check a JSON schema's depth, size, item counts and regexes, without recursion.

    Raises:
        ValueError: A bound is exceeded (the message names it).
    """
    stack: list[tuple[Any, int]] = [(schema, 1)]
    nodes = 0
    items = 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise ValueError(f"the schema is too large (more than {MAX_SCHEMA_NODES} values)")
        if isinstance(node, list | dict) and depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f"the schema is nested more than {MAX_SCHEMA_DEPTH} levels deep")
        if isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)
        elif isinstance(node, dict):
            items += _counts(node)
            if items > MAX_ITEMS_TOTAL:
                raise ValueError(
                    f"the schema's item counts ({', '.join(COUNT_KEYWORDS)}) add up to more "
                    f"than {MAX_ITEMS_TOTAL}"
                )
            if isinstance(node.get("pattern"), str):
                check_regex(node["pattern"])
            if isinstance(node.get("patternProperties"), dict):
                for key in node["patternProperties"]:
                    check_regex(key)
            stack.extend((value, depth + 1) for value in node.values())


def _counts(node: dict[str, Any]) -> int:
    """The item counts one schema object asks for (each bounded)."""
    total = 0
    for key in COUNT_KEYWORDS:
        value = node.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            if value > MAX_ITEMS:
                raise ValueError(f"{key} {value:g} is above this server's limit of {MAX_ITEMS}")
            total += int(value)
    return total


def check_regex(pattern: str) -> None:
    """Check a regex's length and repetition counts.

    Raises:
        ValueError: A bound is exceeded.
    """
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"a regex is longer than {MAX_PATTERN_CHARS} characters")
    _check_repeats(pattern)


def _check_repeats(text: str) -> None:
    for match in _REPEAT.finditer(text):
        for count in match.groups():
            if count and int(count) > MAX_REPEAT:
                raise ValueError(
                    f"the repetition {match.group()} is above this server's limit of {MAX_REPEAT}"
                )


def check_grammar(grammar: str) -> None:
    """Check a lark grammar's length, repetition counts and `%json` schemas.

    Raises:
        ValueError: A bound is exceeded, or a `%json` schema is not JSON.
    """
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise ValueError(f"the grammar is longer than {MAX_GRAMMAR_CHARS} characters")
    decoder = json.JSONDecoder()
    at = 0
    plain: list[str] = []  # the grammar without its %json schemas (their braces are JSON)
    for directive in _JSON_DIRECTIVE.finditer(grammar):
        if directive.start() < at:
            continue
        plain.append(grammar[at : directive.start()])
        try:
            schema, at = decoder.raw_decode(grammar, directive.end())
        except RecursionError:
            raise ValueError("a %json schema in the grammar is nested too deeply") from None
        except ValueError:
            raise ValueError("a %json directive in the grammar is not followed by JSON") from None
        check_schema(schema)
    plain.append(grammar[at:])
    _check_repeats("".join(plain))

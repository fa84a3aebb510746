"""Text folded for matching: the form the content filter's rules see, with a map back to
the text as written.

A rule written as `password dump` must also catch it with an NBSP and two spaces between
the words, with a Cyrillic a (U+0430), a zero-width space inside, in fullwidth letters
(U+FF50...), and as a JSON string's `pass\\u0077ord`, while the text passed on keeps its
original form. `fold` makes, for each source character (or JSON escape sequence):

1. JSON string escapes decoded (`\\u0040` is `@`, surrogate pairs joined): a tool call's
   arguments reach the client decoded (`json.loads`), so the rules must see them so;
2. default-ignorable code points dropped (zero-width spaces and joiners, U+2060, the soft
   hyphen, bidi controls, variation selectors, tags; Unicode's Default_Ignorable_Code_Point);
3. compatibility decomposition (NFKD: fullwidth, mathematical and small forms, ligatures,
   NBSP) with the combining marks it leaves dropped (`é` is `e`);
4. confusables mapped to their prototype, as Unicode TR39's skeleton does, for the
   non-ASCII characters whose prototype is one ASCII letter or digit (Cyrillic o, U+043E,
   and Greek omicron, U+03BF, are `o`), from Unicode's confusables.txt as the
   `confusable-homoglyphs` package ships it. Unlike TR39, ASCII itself is kept (TR39
   maps `1` to `l` and `m` to `rn`, which would turn card numbers into letters and break
   operators' regexes);
5. case folded (`str.casefold`), dashes (Unicode Pd) made `-`, and whitespace runs
   collapsed into one space.

No onnxruntime-genai, no HTTP here.
"""

from __future__ import annotations

import functools
import json
import unicodedata
from dataclasses import dataclass
from importlib import resources

# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt, 16.0), as ranges.
_IGNORABLE = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")


def _ignorable(char: str) -> bool:
    code = ord(char)
    return any(low <= code <= high for low, high in _IGNORABLE) or (
        unicodedata.category(char) == "Cf"
    )


@functools.cache
def _prototypes() -> dict[str, str]:
    """Non-ASCII confusables whose TR39 prototype is one ASCII letter or digit."""
    data = resources.files("confusable_homoglyphs").joinpath("confusables.json").read_text("utf-8")
    table: dict[str, list[dict[str, str]]] = json.loads(data)
    out: dict[str, str] = {}
    for char, entries in table.items():
        if len(char) != 1 or char.isascii():
            continue
        ascii_ = [e["c"] for e in entries if len(e["c"]) == 1 and e["c"].isascii()]
        ascii_ = [c for c in ascii_ if c.isalnum()]
        if ascii_:
            out[char] = ascii_[0]
    return out


@functools.lru_cache(maxsize=65536)
def fold_char(char: str) -> str:
    """What one character folds to ("" for one that folds away); whitespace is " "."""
    if _ignorable(char):
        return ""
    prototypes = _prototypes()
    out: list[str] = []
    for part in unicodedata.normalize("NFKD", char):
        if unicodedata.combining(part) or unicodedata.category(part) in ("Mn", "Me"):
            continue
        for folded in prototypes.get(part, part).casefold():
            if folded.isspace():
                out.append(" ")
            elif unicodedata.category(folded) == "Pd":
                out.append("-")
            elif not _ignorable(folded):
                out.append(folded)
    return "".join(out)


@dataclass(frozen=True)
class Folded:
    """A text's folded form, and where each of its characters came from.

    Attributes:
        text: The folded text.
        source: The text as written.
        starts: For each folded character, where its source begins in `source`.
        ends: For each folded character, where its source ends in `source`.
    """

    text: str
    source: str
    starts: tuple[int, ...]
    ends: tuple[int, ...]

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The span of `source` that the folded `text[start:end]` comes from (an empty
        span: the position in `source` where the folded position falls)."""
        if start >= end:
            where = self.starts[start] if start < len(self.starts) else len(self.source)
            return where, where
        return self.starts[start], self.ends[end - 1]


def _unit(text: str, i: int) -> tuple[str, int]:
    """The character at `text[i]` and the length of its source: one character, or a JSON
    escape sequence (a surrogate pair's two `\\u` escapes together)."""
    if text[i] != "\\" or i + 1 >= len(text):
        return text[i], 1
    escaped = text[i + 1]
    if escaped in _ESCAPES:
        return _ESCAPES[escaped], 2
    if escaped != "u" or not _HEX.issuperset(text[i + 2 : i + 6]) or i + 6 > len(text):
        return text[i], 1
    code = int(text[i + 2 : i + 6], 16)
    if 0xD800 <= code < 0xDC00 and text[i + 6 : i + 8] == "\\u" and i + 12 <= len(text):
        low_hex = text[i + 8 : i + 12]
        if _HEX.issuperset(low_hex) and 0xDC00 <= (low := int(low_hex, 16)) < 0xE000:
            return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), 12
    if 0xD800 <= code < 0xE000:  # a lone surrogate: no character
        return "", 6
    return chr(code), 6


def load_tables() -> None:
    """Read the confusables table now (900 KB of JSON, about 30 ms), not on the first
    request that needs it."""
    _prototypes()


# The output guard asks for the same held text's deny matches, personal data and open end
# in turn: one fold serves them (a Folded is immutable).
@functools.lru_cache(maxsize=16)
def fold(text: str) -> Folded:
    """`text` folded for matching (the module's steps), with its map back."""
    out: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    i = 0
    while i < len(text):
        char, size = _unit(text, i)
        for folded in fold_char(char) if char else "":
            if folded == " " and out and out[-1] == " ":
                ends[-1] = i + size  # a whitespace run is one space
                continue
            out.append(folded)
            starts.append(i)
            ends.append(i + size)
        i += size
    return Folded("".join(out), text, tuple(starts), tuple(ends))

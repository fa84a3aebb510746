"""Text folded for matching: the forms the content filter's rules see, each with a map back
to the text as written.

A rule written as `password dump` must also catch it with an NBSP and two spaces between
the words, with a Cyrillic a (U+0430), a zero-width space inside, in fullwidth letters
(U+FF50...), in small capitals (U+1D18...) or with a stroke (`passwørd`), and as a JSON
string's `pass\\u0077ord`, while the text passed on keeps its original form.

A text is read at each level of decoding a client may apply (`forms`): as written, then
with its escapes decoded once, twice, ... until nothing changes. The server itself decodes
a tool call's arguments twice (the call's JSON, then its `arguments` string) before it
re-encodes them: the rules must see what the client finally gets, however many times it
was encoded. One decoding (`decode`) turns, for each source sequence:

- a JSON string escape into its character (`\\u0040` is `@`, surrogate pairs joined);
- an HTML character reference into its text (`&#64;`, `&#x40;`, `&commat;` are `@`;
  `html.unescape`);
- a percent-encoded UTF-8 sequence into its character (`%40` is `@`, `%C3%A9` is `é`;
  as `urllib.parse.unquote`).

Each form is then folded, character by character (`fold_char`):

1. blank-looking characters that Unicode calls default-ignorable or a symbol (the Hangul
   fillers U+115F, U+1160, U+3164, U+FFA0, the Braille blank U+2800) are a space: a
   reader sees two words; the other default-ignorable code points (zero-width spaces and
   joiners, U+2060, the soft hyphen, bidi controls, variation selectors, tags; Unicode's
   Default_Ignorable_Code_Point) and format characters (Cf) are dropped: a reader sees
   one word;
2. compatibility decomposition (NFKD: fullwidth, mathematical and small forms, ligatures,
   NBSP) with the combining marks it leaves dropped (`é` is `e`);
3. confusables mapped to their prototype, as Unicode TR39's skeleton does, for the
   non-ASCII characters whose prototype is one ASCII letter or digit (Cyrillic o, U+043E,
   and Greek omicron, U+03BF, are `o`), from Unicode's confusables.txt as the
   `confusable-homoglyphs` package ships it. Unlike TR39, ASCII itself is kept (TR39
   maps `1` to `l` and `m` to `rn`, which would turn card numbers into letters and break
   operators' regexes);
4. case folded (`str.casefold`);
5. Latin letters still not ASCII (strokes, hooks, small capitals, IPA: `ø`, `đ`, `ᴘ`,
   `ɗ`) transliterated to their base letters by the `anyascii` table (`æ` is `ae`);
   other scripts keep their letters (a reader does not take `д` for `d`);
6. dashes (Unicode Pd) made `-`, and whitespace runs collapsed into one space.

No onnxruntime-genai, no HTTP here.
"""

from __future__ import annotations

import functools
import html
import json
import re
import unicodedata
from dataclasses import dataclass
from importlib import resources

from anyascii import anyascii

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
# Characters no font draws but as a gap (a letter's width of nothing): the Hangul fillers
# (default-ignorable, yet shown as a blank) and the Braille pattern blank (a symbol).
_BLANKS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")
# HTML character references: numeric ones with or without `;` (as browsers read them),
# named ones with it (`&amp;`; `AT&T` stays).
_ENTITY = re.compile(r"&(?:#[0-9]{1,7};?|#[xX][0-9a-fA-F]{1,6};?|[A-Za-z][A-Za-z0-9]{1,31};)")
# What may begin an encoding (`_unit`): a backslash, an ampersand, a percent sign.
_ENCODED = re.compile(r"[\\&%]")
_MAX_LEVELS = 8  # decodings tried (each one shortens the text, so this bounds the work)


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


def _latin_letter(char: str) -> bool:
    return unicodedata.category(char).startswith("L") and unicodedata.name(char, "").startswith(
        ("LATIN ", "MODIFIER LETTER ")
    )


def _base_letters(char: str) -> str:
    """A Latin letter that is not ASCII as its base letters (anyascii's table, less the
    marks it writes for strokes: `ꝁ` is `k.` there, `k` here); any other character, or one
    the table spells with no letter (a glottal stop is `'`), as it is."""
    if char.isascii() or not _latin_letter(char):
        return char
    based = "".join(c for c in anyascii(char).casefold() if c.isalnum())
    return based if based.isascii() and based else char


@functools.lru_cache(maxsize=65536)
def fold_char(char: str) -> str:
    """What one character folds to ("" for one that folds away); whitespace is " "."""
    if char in _BLANKS:
        return " "
    if _ignorable(char):
        return ""
    prototypes = _prototypes()
    # A letter's decomposition may add a sign (`ŀ` is `l·`): a reader sees one letter.
    letter_only = _latin_letter(char)
    out: list[str] = []
    for part in unicodedata.normalize("NFKD", char):
        if unicodedata.combining(part) or unicodedata.category(part) in ("Mn", "Me"):
            continue
        for cased in prototypes.get(part, part).casefold():
            for folded in _base_letters(cased):
                if letter_only and not folded.isalnum():
                    continue
                if folded.isspace() or folded in _BLANKS:
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


def _json_escape(text: str, i: int) -> tuple[str, int] | None:
    """The JSON escape sequence at `text[i]` (a backslash): its character ("" for a lone
    surrogate) and length (a surrogate pair's two `\\u` escapes together); None: none."""
    escaped = text[i + 1 : i + 2]
    if escaped in _ESCAPES and escaped:
        return _ESCAPES[escaped], 2
    if escaped != "u" or i + 6 > len(text) or not _HEX.issuperset(text[i + 2 : i + 6]):
        return None
    code = int(text[i + 2 : i + 6], 16)
    if 0xD800 <= code < 0xDC00 and text[i + 6 : i + 8] == "\\u" and i + 12 <= len(text):
        low_hex = text[i + 8 : i + 12]
        if _HEX.issuperset(low_hex) and 0xDC00 <= (low := int(low_hex, 16)) < 0xE000:
            return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), 12
    if 0xD800 <= code < 0xE000:  # a lone surrogate: no character
        return "", 6
    return chr(code), 6


def _percent(text: str, i: int) -> tuple[str, int] | None:
    """The percent-encoded UTF-8 character at `text[i]` (a `%`) and its length; None:
    none (not `%XX`, or bytes that are not one UTF-8 character)."""
    raw = bytearray()
    at = i
    while at + 3 <= len(text) and text[at] == "%" and _HEX.issuperset(text[at + 1 : at + 3]):
        raw.append(int(text[at + 1 : at + 3], 16))
        at += 3
        lead = raw[0]
        size = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        if len(raw) == size:
            try:
                return raw.decode("utf-8"), at - i
            except UnicodeDecodeError:
                return None
    return None


def _unit(text: str, i: int) -> tuple[str, int]:
    """What the sequence at `text[i]` decodes to, and its length in `text`: an escape,
    a character reference or a percent-encoding, else the character itself."""
    char = text[i]
    decoded: tuple[str, int] | None = None
    if char == "\\":
        decoded = _json_escape(text, i)
    elif char == "&" and (entity := _ENTITY.match(text, i)) is not None:
        written = entity.group()
        decoded = (html.unescape(written), len(written))
    elif char == "%":
        decoded = _percent(text, i)
    return decoded if decoded is not None else (char, 1)


def decode(text: str) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """`text` decoded once (the module's decodings), with each decoded character's source
    span in `text` (starts, ends)."""
    if not _ENCODED.search(text):  # most text: nothing to decode, each character its own
        return text, tuple(range(len(text))), tuple(range(1, len(text) + 1))
    out: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    i = 0
    while i < len(text):
        chars, size = _unit(text, i)
        for char in chars:
            out.append(char)
            starts.append(i)
            ends.append(i + size)
        i += size
    return "".join(out), tuple(starts), tuple(ends)


def load_tables() -> None:
    """Read the confusables table now (900 KB of JSON, about 30 ms), not on the first
    request that needs it."""
    _prototypes()


def _folded(text: str, source: str, starts: tuple[int, ...], ends: tuple[int, ...]) -> Folded:
    """`text` (whose characters come from `source` at `starts`/`ends`) folded."""
    out: list[str] = []
    f_starts: list[int] = []
    f_ends: list[int] = []
    for i, char in enumerate(text):
        for folded in fold_char(char):
            if folded == " " and out and out[-1] == " ":
                f_ends[-1] = ends[i]  # a whitespace run is one space
                continue
            out.append(folded)
            f_starts.append(starts[i])
            f_ends.append(ends[i])
    return Folded("".join(out), source, tuple(f_starts), tuple(f_ends))


# The output guard asks for the same held text's deny matches, personal data and open end
# in turn: one decoding serves them (a Folded is immutable).
@functools.lru_cache(maxsize=16)
def decodings(text: str) -> tuple[Folded, ...]:
    """`text` at each level of decoding, not folded: as written, decoded once, twice, ...
    until nothing changes, each with its map back onto `text`."""
    identity = tuple(range(len(text)))
    out = [Folded(text, text, identity, tuple(i + 1 for i in identity))]
    for _ in range(_MAX_LEVELS):
        level = out[-1]
        decoded, d_starts, d_ends = decode(level.text)
        if decoded == level.text:
            break
        # Each decoded character's span in `level`, then in `text`.
        starts = tuple(level.starts[s] for s in d_starts)
        ends = tuple(level.ends[e - 1] for e in d_ends)
        out.append(Folded(decoded, text, starts, ends))
    return tuple(out)


@functools.lru_cache(maxsize=16)
def forms(text: str) -> tuple[Folded, ...]:
    """`text` folded at each level of decoding (`decodings`; the levels whose folded
    texts differ), each with its map back onto `text`."""
    out: list[Folded] = []
    for level in decodings(text):
        folded = _folded(level.text, text, level.starts, level.ends)
        if not out or folded.text != out[-1].text:
            out.append(folded)
    return tuple(out)


def fold(text: str) -> Folded:
    """`text` folded for matching, fully decoded (the last of `forms`), with its map back."""
    return forms(text)[-1]

"""The operator's content filter: rules on what goes into the model and what comes out.

Off unless `ORTSERVE_CONTENT_FILTER` names a TOML file (docs/api.md, "Content filter"):

    redaction = "[{kind}]"            # what a redacted span becomes

    [input]                           # the prompt, each chat message's text
    max_chars = 20000                 # longer texts are refused
    control_characters = false        # C0/C1 controls other than tab, CR, LF refused
    deny = ['(?i)ignore (all )?previous instructions']   # Python regexes
    deny_words = ["password dump"]    # words or phrases: whole words, any case
    redact = ["email", "phone", "card"]                  # personal data, replaced

    [output]                          # the generated text, streamed or not
    deny = ['(?i)\\bkill\\b']
    deny_words = []
    redact = ["email"]
    hold_chars = 32                   # a stream holds this much back to cut exactly

A refused request is an `InvalidRequestError` with code `content_filter` (the API's 400;
the message names the rule, never the text). Output that meets a deny rule ends there:
the text before the match is kept, the finish reason is `content_filter`. Redaction
happens before the model sees the prompt (the model never reads the data) and on the
output before it leaves. Rules see the texts as the client sent them, not the chat
template around them. No onnxruntime-genai, no HTTP here.
"""

from __future__ import annotations

import bisect
import re
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ortserve.core.errors import InvalidRequestError
from ortserve.core.fold import decodings, fold, forms, load_tables
from ortserve.core.generation import GenerationRequest

Kind = Literal["email", "phone", "card"]

# Personal data, as found in free text (none is perfect: they err towards redacting). They
# run on the folded forms (core.fold): fullwidth and small at-signs are `@`, an NBSP or a
# Braille blank is a space, every dash is `-`, zero-width characters are gone, JSON
# escapes, HTML character references and percent-encodings are decoded (`%40`, `&#64;`).
# Addresses take any letters (`josé@example.com`, `bob@examplé.com`) and the usual
# disguises of their `@` and dots: ` @ `, `(at)`, `[at]`, `{at}`, `(dot)`, `[dot]`.
_AT = r"(?: ?@ ?| ?[(\[{] ?at ?[)\]}] ?)"
_DOT = r"(?:\.| ?[(\[{] ?dot ?[)\]}] ?)"
_EMAIL = rf"(?<![\w.%+-])[\w.%+-]+{_AT}[\w-]+(?:{_DOT}[\w-]+)*{_DOT}[^\W\d_]{{2,}}"
# 13 to 19 digits, Luhn-checked, each pair apart by nothing, a space, one of `/_.,:|-`, or
# one of those with a space on either side (`4111 - 1111`).
_CARD = (
    r"(?<![\d/_-])(?<!\d[.,])\d(?: ?[/_.,:|-] ?| )?(?:\d(?: ?[/_.,:|-] ?| )?){11,17}\d(?![\d/_-])"
)
# 7 to 15 digits apart by spaces, dots, dashes, brackets; or groups of 2 to 4 digits apart
# by one `,` or `/` each (`555/123/4567`), not all of a length (`10,20,30`, a list).
_PHONE = (
    r"(?<![\w+])(?<!\d[.,])\+?(?:\(\d{1,4}\)[ .-]?)?\d(?:[ ().-]{0,2}\d){6,14}(?!\w)"
    r"|(?<![\w+,/.-])\d{2,4}(?P<sep>[,/])\d{2,4}(?:(?P=sep)\d{2,4}){1,3}(?![,/.-]?\d)(?!\w)"
)
_DATE = re.compile(r"\d{4}([-./])\d{1,2}\1\d{1,2}|\d{1,2}([-./])\d{1,2}\2\d{4}")  # not phones
_DECIMAL = re.compile(r"\d+\.\d+")  # 3.14159265: neither a phone nor a card
_FRACTION = re.compile(r"\.\d{5,}")  # nor is `3.14159 2` (phones group 4 digits at most)
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+")  # 12,345,678: a number, not a card or phone
# Controls a text may not hold when `control_characters` is false: C0 but tab, LF, CR;
# DEL; C1.
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# The end of a text that may still become personal data as more text comes: its last
# word (an address), or a run of digits and separators (a card, a phone number). A
# stream holds it back (up to MAX_OPEN_CHARS) so that a span is redacted whole.
# An address's disguised `@` (` @ `, ` (at) `) may be coming: the word before a last space,
# or before an `@` or `(at)` begun, is held too.
_OPEN_TAIL = re.compile(
    r"(?:\S+ (?:[@(\[{]\S*)? ?)?\S*\Z|\S+ ?[@(\[{]\S* ?\S*\Z|[\d ()/_.,:|+-]*\Z"
)
MAX_OPEN_CHARS = 320


def _luhn(digits: str) -> bool:
    total = 0
    for i, char in enumerate(reversed(digits)):
        n = int(char) * (2 if i % 2 else 1)
        total += n - 9 if n > 9 else n
    return total % 10 == 0


def _digits(text: str) -> str:
    return "".join(c for c in text if c.isdigit())


def _card(match: str) -> bool:
    """A card number, not a decimal (2.718281828459045), a number written with thousands
    separators or a list of numbers (`1, 2, 3, ...`): apart by `,`, `:` or `|`, its groups
    have 4 digits or more (the last 3 or more), as cards are printed."""
    if not _luhn(_digits(match)) or _THOUSANDS.fullmatch(match) or _DECIMAL.fullmatch(match):
        return False
    groups = [len(g) for g in re.findall(r"\d+", match)]
    return not re.search(r"[,:|]", match) or (min(groups[:-1]) >= 4 and groups[-1] >= 3)


def _phone(match: str) -> bool:
    """A phone number, not a date, a decimal, a number with thousands separators or a
    list of numbers of one length."""
    if not 7 <= len(_digits(match)) <= 15 or _DATE.fullmatch(match):
        return False
    if _DECIMAL.fullmatch(match) or _THOUSANDS.fullmatch(match) or _FRACTION.search(match):
        return False
    groups = re.findall(r"\d+", match)
    return not (re.search(r"[,/]", match) and len({len(g) for g in groups}) == 1)


def _card_part(text: str, match: re.Match[str]) -> tuple[int, int] | None:
    """The card number in a run of digit groups that is not one as a whole (a card after
    other numbers, or before them: `12, 4111 1111 1111 1111, 55`): the longest run of
    whole groups of 4 or more digits (the last may have 3) that is one, earliest first."""
    groups = list(re.finditer(r"\d+", match.group()))
    for i in range(len(groups)):
        for j in range(len(groups) - 1, i, -1):
            if min(len(g.group()) for g in groups[i:j]) < 4 or len(groups[j].group()) < 3:
                continue
            part = match.group()[groups[i].start() : groups[j].end()]
            if 13 <= len(_digits(part)) <= 19 and _card(part):
                base = match.start()
                return base + groups[i].start(), base + groups[j].end()
    return None


# Each kind: its pattern, a check of a match (None: every match counts), and where to look
# for it inside a match the check refuses (None: nowhere). Order matters: a card number is
# not also redacted as a phone number.
_Finder = Callable[[str, re.Match[str]], tuple[int, int] | None]
_KINDS: dict[str, tuple[re.Pattern[str], Callable[[str], bool] | None, _Finder | None]] = {
    "email": (re.compile(_EMAIL), None, None),
    "card": (re.compile(_CARD), _card, _card_part),
    "phone": (re.compile(_PHONE), _phone, None),
}


def _found(
    text: str, rx: re.Pattern[str], check: Callable[[str], bool] | None, inside: _Finder | None
) -> Iterator[tuple[int, int]]:
    """The spans of `text` that `rx` matches and `check` accepts (or `inside` finds)."""
    at = 0
    while at <= len(text) and (m := rx.search(text, at)) is not None:
        span: tuple[int, int] | None = m.span()
        if check is not None and not check(m.group()):
            span = inside(text, m) if inside is not None else None
        if span is not None:
            yield span
        at = max(m.end(), m.start() + 1) if span is None else max(span[1], m.start() + 1)


class _Rules(BaseModel):
    model_config = ConfigDict(extra="forbid")

    deny: list[str] = Field(default_factory=list, description="Python regexes")
    deny_words: list[str] = Field(default_factory=list, description="words or phrases")
    redact: list[Kind] = Field(default_factory=list)

    @field_validator("deny")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"deny pattern {pattern!r} is not a regex: {exc}") from None
        return patterns


class InputRules(_Rules):
    """Rules on the prompt and each chat message's text."""

    max_chars: int | None = Field(default=None, ge=1)
    control_characters: bool = True


class OutputRules(_Rules):
    """Rules on the generated text."""

    hold_chars: int = Field(default=32, ge=0, le=4096)


class FilterFile(BaseModel):
    """The filter file's contents."""

    model_config = ConfigDict(extra="forbid")

    redaction: str = "[{kind}]"
    input: InputRules = Field(default_factory=InputRules)
    output: OutputRules = Field(default_factory=OutputRules)


class ContentFilterError(InvalidRequestError):
    """A request the content filter refused: OpenAI's `content_filter` code."""

    code = "content_filter"

    def __init__(self, rule: str) -> None:
        super().__init__(f"the request was refused by this server's content filter (rule {rule})")
        self.rule = rule


@dataclass(frozen=True)
class Screened:
    """A request as the model gets it, and what the input rules did to it."""

    request: GenerationRequest
    redactions: int = 0


class _Compiled:
    """One stage's rules, compiled: deny regexes (in order), then the redactors.

    Deny regexes see the text at each level of decoding (core.fold: as written, decoded
    once, twice, ...: what a client sees however many times it decodes it), unfolded and
    folded; deny words and the redactors the folded forms only. Matches are mapped back
    onto the text as written."""

    def __init__(self, rules: _Rules, redaction: str) -> None:
        deny = [(f"deny[{i}]", re.compile(p)) for i, p in enumerate(rules.deny)]
        self.deny = [(name, rx, True) for name, rx in deny]
        words = [w for w in (fold(w).text.strip() for w in rules.deny_words) if w]
        if words:
            union = "|".join(re.escape(w) for w in words)
            rx = re.compile(rf"(?<!\w)(?:{union})(?!\w)", re.IGNORECASE)
            self.deny.append(("deny_words", rx, False))
        self.redactors = [(kind, *_KINDS[kind]) for kind in _KINDS if kind in rules.redact]
        self.redaction = redaction

    def denied(self, text: str, after: int = 0) -> tuple[str, int] | None:
        """The earliest deny match in `text` that ends past `after`: its rule's name and
        where it starts in `text` (text before `after` is context, already let through)."""
        found: list[tuple[int, str]] = []
        for name, rx, as_written in self.deny:
            for form in (*forms(text), *(decodings(text) if as_written else ())):
                spans = (form.span(*m.span()) for m in rx.finditer(form.text))
                start = next((s for s, e in spans if e > after), None)
                if start is not None:
                    found.append((start, name))
        if not found:
            return None
        start, name = min(found)
        return name, start

    def spans(self, text: str) -> list[tuple[int, int, str]]:
        """Personal data in `text`: (start, end, kind), not overlapping, in order. The most
        decoded form's spans come first: they are what the client reads."""
        spans: list[tuple[int, int, str]] = []  # in order, none overlapping another
        for kind, rx, check, inside in self.redactors:
            for folded in reversed(forms(text)):
                for found in _found(folded.text, rx, check, inside):
                    start, end = folded.span(*found)
                    # Of the spans that start before `end`, the last ends last: it alone
                    # may overlap (a bisection, so that a text of many spans costs n log n).
                    at = bisect.bisect_left(spans, (end,))
                    if at == 0 or spans[at - 1][1] <= start:
                        spans.insert(at, (start, end, kind))
        return spans

    def open_tail(self, text: str) -> int:
        """Where the end of `text` that may still become personal data starts (len(text):
        nothing may; never more than MAX_OPEN_CHARS back)."""
        if not self.redactors:
            return len(text)
        start = len(text)
        for folded in forms(text):
            tail = _OPEN_TAIL.search(folded.text)
            if tail is not None:
                start = min(start, folded.span(tail.start(), tail.start())[0])
        return max(start, len(text) - MAX_OPEN_CHARS)

    def redact(self, text: str, spans: list[tuple[int, int, str]] | None = None) -> tuple[str, int]:
        """`text` with its personal data (`spans`, else found now) replaced, and how many
        spans were."""
        spans = self.spans(text) if spans is None else spans
        out, at = [], 0
        for start, end, kind in spans:
            out += [text[at:start], self.redaction.format(kind=kind)]
            at = end
        return "".join([*out, text[at:]]), len(spans)


class ContentFilter:
    """The rules of one filter file, for the service: `screen` a request before the
    model, `guard` each generation's output."""

    def __init__(self, rules: FilterFile) -> None:
        self.rules = rules
        load_tables()
        self._input = _Compiled(rules.input, rules.redaction)
        self._output = _Compiled(rules.output, rules.redaction)

    @classmethod
    def load(cls, path: Path) -> ContentFilter:
        """Read and check a filter file.

        Raises:
            ValueError: The file cannot be read, is not TOML, or breaks the schema.
        """
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
            return cls(FilterFile.model_validate(data))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"content filter {path}: {exc}") from None
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_input=False)[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"content filter {path}: {where}: {first['msg']}") from None

    @property
    def filters_output(self) -> bool:
        """Whether any output rule is set."""
        return bool(self._output.deny or self._output.redactors)

    def screen(self, request: GenerationRequest) -> Screened:
        """The request with its texts checked and redacted.

        Raises:
            ContentFilterError: A text breaks a rule (the error names the rule).
        """
        if request.logprobs is not None and self.filters_output:
            # Each token's text (and the alternatives) would show what the rules hide.
            raise InvalidRequestError(
                "log probabilities are not available on this server: it filters the output",
                "logprobs",
            )
        count = 0

        def check(text: str) -> str:
            nonlocal count
            rules = self.rules.input
            if rules.max_chars is not None and len(text) > rules.max_chars:
                raise ContentFilterError("input.max_chars")
            if not rules.control_characters and _CONTROLS.search(text):
                raise ContentFilterError("input.control_characters")
            denied = self._input.denied(text)
            if denied is not None:
                raise ContentFilterError(f"input.{denied[0]}")
            text, found = self._input.redact(text)
            count += found
            return text

        if request.prompt is not None:
            return Screened(replace(request, prompt=check(request.prompt)), count)
        messages = [_screened_message(m, check) for m in request.messages or []]
        return Screened(replace(request, messages=messages), count)

    def guard(self) -> OutputGuard:
        """A guard for one generation's output."""
        return OutputGuard(self._output, self.rules.output.hold_chars)


def _screened_message(message: dict[str, Any], check: Callable[[str], str]) -> dict[str, Any]:
    out = dict(message)
    for key in ("content", "reasoning_content"):
        if isinstance(out.get(key), str):
            out[key] = check(out[key])
    return out


def _word_start(text: str, at: int) -> int:
    """Where the word that `at` falls inside begins (`at` itself at a word's edge, or in a
    word that begins more than MAX_OPEN_CHARS back)."""
    if not 0 < at < len(text) or text[at].isspace():
        return at
    floor, start = max(0, at - MAX_OPEN_CHARS), at
    while start > floor and not text[start - 1].isspace():
        start -= 1
    return start if start == 0 or text[start - 1].isspace() else at


class OutputGuard:
    """The output rules over a stream of text deltas (after the stop strings).

    Holds back the last `hold` characters, and the end of the text that may still become
    personal data (its last word, or a run of digits and separators), so that a deny
    match or a redacted span is cut exactly however the text is split; a deny match
    longer than that, or beginning in text already sent, is still caught, but its first
    part has gone out. A stop string's cut is seen too (`flush(beyond=...)`): data that a
    stop string cuts in two is redacted whole. `rule` names the deny rule that ended the
    output; `redactions` counts the spans replaced.
    """

    def __init__(self, rules: _Compiled, hold: int) -> None:
        self._rules = rules
        self._hold = hold
        self._held = ""
        self._sent_tail = ""  # the last `hold` characters sent: context for deny rules
        self.rule = ""
        self.redactions = 0

    @property
    def stopped(self) -> bool:
        """Whether a deny rule ended the output."""
        return bool(self.rule)

    def feed(self, delta: str) -> str:
        """Add a delta; return the text that may go out now."""
        if self.stopped:
            return ""
        self._held += delta
        return self._release(final=False)

    def flush(self, beyond: str = "") -> str:
        """The held text, once the generation has ended. `beyond`: the text a stop string
        cut off (the stop string on), which never goes out but which the rules see, so
        that a span or a deny match it cuts in two is still found."""
        return "" if self.stopped else self._release(final=True, beyond=beyond)

    def _release(self, final: bool, beyond: str = "") -> str:
        text, context = self._held, self._sent_tail
        # Only a match reaching into the new text counts: the context's first character
        # is a cut, not a word's start (its "kill" may be the end of a sent "skill").
        denied = self._rules.denied(context + text + beyond, after=len(context))
        if denied is not None and denied[1] < len(context) + len(text):
            self.rule = f"output.{denied[0]}"
            cut = max(0, denied[1] - len(context))
            return self._out(text[:cut], "", self._rules.spans(text[:cut]))
        spans = self._rules.spans(text + beyond)
        cut = len(text)
        if not final:
            cut = min(max(0, len(text) - self._hold), self._rules.open_tail(text))
            cut = _word_start(text, cut)  # a date cut in two may look like a phone number
            for start, end, _ in spans:
                if start < cut < end:
                    cut = start  # keep a span whole for later
        return self._out(text[:cut], text[cut:], spans)

    def _out(self, out: str, held: str, spans: list[tuple[int, int, str]]) -> str:
        """Send `out` (its personal data, `spans` found with what follows it, redacted),
        hold `held`."""
        self._held = held
        self._sent_tail = (self._sent_tail + out)[-self._hold :] if self._hold else ""
        if self._rules.redactors:
            spans = [(s, min(e, len(out)), k) for s, e, k in spans if s < len(out)]
            out, found = self._rules.redact(out, spans)
            self.redactions += found
        return out

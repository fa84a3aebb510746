"""ortserve.core.fold: the form the content filter's rules see, and its map back."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ortserve.core.fold import decodings, fold, forms


def test_each_step() -> None:
    assert fold("Pass\u00a0 \tDUMP").text == "pass dump"  # case, NBSP, a whitespace run
    assert fold("p\u0430ss\u200bw\u00adord").text == "password"  # Cyrillic a, ZWSP, SHY
    assert fold("\uff50\uff41\uff53\uff53").text == "pass"  # fullwidth
    assert fold("caf\u00e9 na\u0308ive").text == "cafe naive"  # marks, precomposed or not
    assert fold("4111\u20131111").text == "4111-1111"  # every dash is "-"
    assert fold("bob\\u0040x.io \\t \\ud83d\\ude00").text == "bob@x.io \U0001f600"
    assert fold("a\\ud800b \\q \\u12").text == "ab \\q \\u12"  # no character, or as written
    assert fold("10 l1").text == "10 l1"  # ASCII is kept (TR39 would make "1" an "l")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.characters(codec="utf-8") | st.sampled_from(["\\u0041", "\\t", "\\"])))
def test_the_map_points_into_the_text_in_order(pieces: list[str]) -> None:
    text = "".join(pieces)
    folded = fold(text)
    assert len(folded.starts) == len(folded.ends) == len(folded.text)
    for start, end in zip(folded.starts, folded.ends, strict=True):
        assert 0 <= start < end <= len(text)
    assert list(folded.starts) == sorted(folded.starts)
    whole = folded.span(0, len(folded.text))
    assert whole == ((folded.starts[0], folded.ends[-1]) if folded.text else (len(text),) * 2)


# -- #49 item 6: blanks, letters with strokes, hooks and small capitals, other encodings --


def _fold_text(text: str) -> str:
    return fold(text).text


@pytest.mark.parametrize("blank", ["\u3164", "\u2800", "\u115f", "\u1160", "\uffa0"])
def test_blank_looking_characters_are_spaces(blank: str) -> None:
    """A reader sees two words: the rules do too (they were dropped: `passworddump`)."""
    assert _fold_text(f"password{blank}dump") == "password dump"
    assert _fold_text(f"password {blank} dump") == "password dump"  # one space still


@pytest.mark.parametrize("invisible", ["\u200b", "\u2060", "\u00ad", "\u180e", "\ufeff"])
def test_invisible_format_characters_are_dropped(invisible: str) -> None:
    assert _fold_text(f"pass{invisible}word") == "password"


@pytest.mark.parametrize(
    ("written", "folded"),
    [
        ("pass\u00f8rd", "passord"),  # o with stroke
        ("forbi\u0111den", "forbidden"),  # d with stroke
        ("\u1d18\u1d00\ua731\ua731\u1d21\u1d0f\u0280\u1d05", "password"),  # small capitals
        ("\u0253\u0257\u0260", "bdg"),  # hooks
        ("\ua741\u0142", "kl"),  # strokes the table marks with a dot (`k.`)
        ("he\u0140lo", "hello"),  # l with middle dot: NFKD adds a sign
        ("\u00e6on", "aeon"),
        ("\u00de\u00f0", "thd"),
    ],
)
def test_latin_letters_fold_to_their_base_letters(written: str, folded: str) -> None:
    assert _fold_text(written) == folded


def test_every_latin_letter_with_a_stroke_hook_or_small_capital_form_folds_to_ascii() -> None:
    left, seen = [], 0
    for code in range(0x80, 0x30000):
        name = unicodedata.name(chr(code), "")
        marked = any(w in name for w in (" STROKE", " HOOK", " SMALL CAPITAL ", " BAR"))
        if name.startswith("LATIN ") and marked and unicodedata.category(chr(code))[0] == "L":
            seen += 1
            if not (out := _fold_text(chr(code))).isascii() or not out.isalpha():
                left.append(name)
    assert seen > 250
    # Letters with no base letter (glottal stops with a stroke) stay as they are.
    assert all("GLOTTAL STOP" in name for name in left), left


def test_other_scripts_keep_their_letters() -> None:
    """Transliteration is for Latin letters only: a reader takes none of these for ASCII
    (their lookalikes are the confusables step's: Cyrillic o, U+043E, is `o`)."""
    for text in ("\u0434\u0430\u043c\u043f", "\u4e2d\u6587", "\u03bb", "\U0001f600", "\u20ac"):
        assert not _fold_text(text).isascii(), text


@pytest.mark.parametrize(
    ("written", "decoded"),
    [
        ("bob&#64;x.io", "bob@x.io"),  # HTML character references
        ("bob&#x40;x.io", "bob@x.io"),
        ("bob&commat;x.io", "bob@x.io"),
        ("bob%40x.io", "bob@x.io"),  # percent-encoding, UTF-8
        ("caf%C3%A9", "cafe"),
        ("forbid\\\\u0064en", "forbidden"),  # JSON escapes twice (a string in a string)
        ("%2540", "@"),  # percent-encoded twice
        ("bob&amp;#64;x", "bob@x"),
    ],
)
def test_each_encoding_is_decoded_as_often_as_it_was_encoded(written: str, decoded: str) -> None:
    assert _fold_text(written) == decoded
    assert forms(written)[0].text == written.casefold()  # and as written, first


@pytest.mark.parametrize("text", ["AT&T", "100% sure", "50%zz", "%C3 x", "a & b;", "C:\\q"])
def test_what_is_no_encoding_stays_as_written(text: str) -> None:
    assert [f.text for f in forms(text)] == [text.casefold()]


def test_each_form_maps_back_onto_the_text_as_written() -> None:
    text = 'say {"q":"forbid\\\\u0064en"} to bob&#64;x.io'
    for form in forms(text):
        at = form.text.index("forbid")
        assert form.span(at, at + len("forbid")) == (text.index("forbid"), text.index("\\\\"))
    last = forms(text)[-1]
    at = last.text.index("forbidden")
    start, end = last.span(at, at + len("forbidden"))
    assert text[start:end] == "forbid\\\\u0064en"
    at = last.text.index("bob@x.io")
    start, end = last.span(at, at + len("bob@x.io"))
    assert text[start:end] == "bob&#64;x.io"
    levels = [d.text for d in decodings(text)]
    assert levels[-1] == 'say {"q":"forbidden"} to bob@x.io'  # decoded, not folded

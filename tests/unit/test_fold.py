"""ortserve.core.fold: the form the content filter's rules see, and its map back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ortserve.core.fold import fold


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

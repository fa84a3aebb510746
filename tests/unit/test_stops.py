"""Stop strings: cut at the first occurrence, never leaked across deltas."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from ortserve.core.stops import StopMatcher


def _run(stops: list[str], deltas: list[str]) -> tuple[list[str], bool]:
    matcher = StopMatcher(stops)
    out = [matcher.feed(d) for d in deltas]
    out.append(matcher.flush())
    return out, matcher.stopped


def test_split_across_deltas_is_cut_exactly() -> None:
    out, stopped = _run(["</end>"], ["Hello </", "en", "d> never"])
    assert stopped
    assert "".join(out) == "Hello "
    assert out[0] == "Hello "  # "</" is held back, not emitted


def test_held_text_is_released_when_it_stops_matching() -> None:
    out, stopped = _run(["STOP"], ["ab ST", "OCK"])
    assert not stopped
    assert out == ["ab ", "STOCK", ""]


def test_the_stop_completed_first_wins_however_the_text_is_split() -> None:
    assert "".join(_run(["zz", "b"], ["aabzz"])[0]) == "aa"
    # "aéa" starts first but "é" is complete first: generation would stop there.
    for deltas in (["a\u00e9a"], ["a\u00e9", "a"], ["a", "\u00e9", "a"]):
        assert "".join(_run(["\u00e9", "a\u00e9a"], deltas)[0]) == "a"


def test_no_stops_passes_through() -> None:
    assert _run([], ["a", "b"]) == (["a", "b", ""], False)


def test_nothing_after_a_stop() -> None:
    matcher = StopMatcher(["x"])
    assert matcher.feed("axb") == "a"
    assert matcher.feed("more") == ""
    assert matcher.flush() == ""


alphabet = st.sampled_from("abc\u00e9\u65e5 ")


@given(
    text=st.text(alphabet, max_size=40),
    stops=st.lists(st.text(alphabet, min_size=1, max_size=4), max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=10),
)
def test_streamed_text_equals_cut_text_and_never_contains_a_stop(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    deltas = [text[a:b] for a, b in itertools.pairwise(bounds)]
    out, stopped = _run(stops, deltas)
    joined = "".join(out)
    hits = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    expected = text[: min(hits)[1]] if hits else text
    assert joined == expected
    assert stopped == bool(hits)
    assert not any(s in joined for s in stops)

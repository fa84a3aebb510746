"""Ollama's `keep_alive`: what it accepts, and which values ask to unload (Go's rules)."""

from __future__ import annotations

import json

import pytest

from ortserve.core.errors import InvalidRequestError
from ortserve.core.protocol.bodies import parse
from ortserve.core.protocol.ollama import OllamaGenerateBody, unloads

# Ollama reads a number as seconds and a string with Go's time.ParseDuration, then
# truncates to whole nanoseconds: 0 ns asks to unload; negative keeps the model for good.
UNLOAD = [0, 0.0, 1e-10, "0", "-0", "+0", "0s", "-0s", "0m0s", "0.5ns", ".9ns", "0h"]
STAY = [0.5, 1, -1, -0.5, 300, "1ns", "5m", "-1m", "1h30m", "1.5h", "2.s", ".5us", "10µs"]


@pytest.mark.parametrize("keep_alive", UNLOAD)
def test_zero_durations_unload(keep_alive: float | str) -> None:
    assert unloads(parse(OllamaGenerateBody, _body(keep_alive)).keep_alive)


@pytest.mark.parametrize("keep_alive", STAY)
def test_other_durations_do_not(keep_alive: float | str) -> None:
    assert not unloads(parse(OllamaGenerateBody, _body(keep_alive)).keep_alive)


def test_no_keep_alive_does_not_unload() -> None:
    assert not unloads(parse(OllamaGenerateBody, b'{"model": "m"}').keep_alive)


@pytest.mark.parametrize("keep_alive", ["-1", "5", "5 minutes", "", "5d", "s", ".s", "1m-1s", "٣s"])
def test_what_go_cannot_parse_is_a_400(keep_alive: str) -> None:
    with pytest.raises(InvalidRequestError, match="keep_alive"):
        parse(OllamaGenerateBody, _body(keep_alive))


def _body(keep_alive: float | str) -> bytes:
    return json.dumps({"model": "m", "keep_alive": keep_alive}).encode()


def test_a_keep_alive_past_floats_range_in_nanoseconds_is_go_s_longest() -> None:
    """1.8e299 s is past float's range in nanoseconds: it raised OverflowError (a 500 the
    fuzz test found); it is Go's longest duration, as Ollama's would be."""
    from ortserve.core.durations import nanoseconds, seconds

    huge = 1.797693134862316e299
    assert not unloads(huge) and not unloads(-huge)
    assert nanoseconds(huge) == 2**63 - 1 and nanoseconds(-huge) == -(2**63 - 1)
    assert seconds(-huge) == float("inf") and seconds(huge) > 9e9

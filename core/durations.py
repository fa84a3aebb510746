"""Ollama's `keep_alive` durations: seconds as a number, or a Go duration string
(Go's time.ParseDuration: "5m", "1h30m", "-1s", "0"); a negative one means for good."""

from __future__ import annotations

import math
import re
from decimal import Decimal

NS = 1_000_000_000
UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": NS,
    "m": 60 * NS,
    "h": 3600 * NS,
}
# [0-9], not \d: the schema's pattern is ECMA-262's, where \d is ASCII.
PART = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)"
GO_DURATION = rf"^[-+]?(0|({PART})+)$"
#: Go's longest duration, in nanoseconds: a longer keep_alive is that long.
_LONGEST = 2**63 - 1


def nanoseconds(value: float | str) -> int:
    """`value` in whole nanoseconds, as Ollama truncates it (a string: a Go duration,
    which the caller has matched against GO_DURATION; a number: seconds).

    Raises:
        ValueError: A string that is not a Go duration.
    """
    if isinstance(value, str):
        text = value.strip()
        if not re.fullmatch(GO_DURATION, text):
            raise ValueError(f"{value!r} is not a duration such as 5m, 1h30m, -1 or 0")
        total = sum(int(Decimal(number) * UNIT_NS[unit]) for number, unit in re.findall(PART, text))
        return -total if text.startswith("-") else total
    ns = value * NS
    if not math.isfinite(ns) or abs(ns) >= _LONGEST:  # Go's durations stop there
        return _LONGEST if value > 0 else -_LONGEST
    return int(ns)


def seconds(value: float | str) -> float:
    """How long `value` keeps a model: seconds, `math.inf` for a negative one (for good),
    0 for one under a nanosecond (unload at once)."""
    ns = nanoseconds(value)
    if ns < 0:
        return math.inf
    return ns / NS


def setting_seconds(text: str) -> float:
    """ORTSERVE_MODEL_KEEP_ALIVE as `seconds` reads it: a number of seconds, or a Go duration."""
    try:
        return seconds(float(text))
    except ValueError:
        return seconds(text)

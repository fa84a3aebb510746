"""Stop strings over a stream of text deltas: cut exactly, never leak a partial match."""

from __future__ import annotations

MAX_STOP_STRINGS = 4


class StopMatcher:
    """Holds back only the text that could still begin a stop string.

    Feed it text deltas; it returns what may be emitted now. Generation stops at the
    first moment a stop string is complete (the occurrence that ends first; on a tie,
    the one that starts first), however the text is split into deltas: `stopped` turns
    True and the text from that stop string on is dropped (`dropped` keeps it, for the
    content filter, which must see what the cut ran through).
    """

    def __init__(self, stops: tuple[str, ...] | list[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False
        self.dropped = ""
        #: The stop string that ended the text (None: none has).
        self.matched: str | None = None

    def feed(self, delta: str) -> str:
        """Add a delta; return the text that is safe to emit."""
        if self.stopped:
            return ""
        if not self.stops:
            return delta
        text = self._held + delta
        found = [(i + len(s), i, s) for s in self.stops if (i := text.find(s)) >= 0]
        if found:
            _, cut, self.matched = min(found)
            self.stopped = True
            self._held = ""
            self.dropped = text[cut:]
            return text[:cut]
        keep = self._partial_suffix(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The held text, when generation ended without a stop string."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:length]):
                    best = length
                    break
        return best

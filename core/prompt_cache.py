"""The prompt cache: recent requests' og generators, kept with their KV caches
for the next request whose prompt begins the same way (see `PromptCache`). It holds the
choice rule only; the engine makes, rewinds and feeds the generators.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ortserve.core.prefill import KEPT_LOGITS_TOKENS

#: A kept generator's token room (prompt + new tokens; capped by the model's context):
#: its KV cache is allocated for all of it at once (and core.sizing declares it).
SLOT_TOKENS = 4096
#: Prompt tokens a reused generator prefills at least (see `PromptCache._choose`).
MIN_APPENDED = 2
#: Tokens a kept prompt must share with a new one for the cache to give it up to that one
#: while it has room for both (see `worth_sharing`).
MIN_SHARED = 64


@dataclass
class _Slot:
    """A kept og Generator: its KV cache holds `prompt`'s tokens, computed by a prefill."""

    prompt: list[int]
    generator: Any
    max_length: int
    key: object  # what a request's options must equal to reuse it (Engine.cache_key)
    scope: str  # whose prompt it is (core.tenants.cache_scope): only they reuse it


class PromptCache:
    """The KV caches of recent requests, kept for the next request whose prompt begins
    the same way (llama-server's `cache_prompt`): it rewinds a kept generator to the
    longest common prefix and prefills only the rest. Greedy, sampled and seeded requests
    alike: a kept generator's own search is neutral, and each request picks its tokens on
    it its own way (core.picker).

    Only a prompt's own tokens are reused. Their cache comes from a prefill, as a fresh
    request's would (and a prefill in two parts equals one here); the cache of tokens a
    request generated comes from decode steps, whose kernels round differently, so
    reusing it would change the next output. A multi-turn chat still reuses everything
    up to the last turn's prompt.

    Attributes:
        slots: Generators kept at most (least recently used go first).
        max_tokens: A kept generator's token room (its KV cache is allocated for it).
    """

    def __init__(self, slots: int, max_tokens: int) -> None:
        self.slots = slots
        self.max_tokens = max_tokens
        self._entries: list[_Slot] = []  # most recently used last
        self._lock = threading.Lock()

    def _choose(self, ids: list[int], room: int, key: object, scope: str) -> tuple[int, int]:
        """(index, common prefix) of the kept generator to reuse for `ids` (-1: none).

        Only a generator of the same `scope` (tenant) is reused for its prompt: another
        tenant's prompt is never a hit, and so never tells of itself. One whose whole
        prompt begins `ids` (the next turn of its conversation) is taken first. Else the
        one sharing the longest start (a system prompt, a preamble), the one that would
        lose least on a tie. og 0.18 cannot copy a generator's KV cache, so taking it
        gives up the rest of its prompt (its conversation would prefill that again): with
        room left in the cache, it is taken only when what it shares is at least
        `MIN_SHARED` tokens and at least as long as what it loses (`worth_sharing`), and
        otherwise a new generator keeps the others whole. When the cache is full and
        nothing is shared, the least recently used one is taken all the same, whoever's
        it was, from position 0 (nothing of its prompt is reused: the slots are shared
        capacity): its KV buffer is allocated already (a 4,096-token buffer costs ~80 ms
        to allocate on the 135M shape).
        """
        best, best_rank, oldest = -1, (False, 0, 0), -1
        for i, entry in enumerate(self._entries):
            if entry.key != key or entry.max_length < room:
                continue
            oldest = i if oldest < 0 else oldest
            if entry.scope != scope:
                continue
            common = common_prefix(entry.prompt, ids)
            lost = len(entry.prompt) - common
            rank = (lost == 0, common, -lost)
            if common and rank > best_rank:
                best, best_rank = i, rank
        whole, best_common = best_rank[0], best_rank[1]
        room_left = len(self._entries) < self.slots
        if (room_left and not whole) and (
            best < 0 or not worth_sharing(best_common, len(self._entries[best].prompt))
        ):
            return -1, 0
        if best < 0:  # full, and nothing shared: reuse the oldest's KV buffer (from 0)
            return oldest, 0
        # At least two tokens are appended: one alone would go through the decode step's
        # kernel (M = 1), whose rounding differs from a prefill's (M > 1), and the output
        # could change (it did, at the 22nd token of a 2,277-token chat prompt).
        return best, max(0, min(best_common, len(ids) - MIN_APPENDED))

    def match(self, ids: list[int], room: int, key: object, scope: str = "") -> int:
        """How many of `ids` the kept generator `take` would give holds (0: none)."""
        with self._lock:
            return self._choose(ids, room, key, scope)[1]

    def take(
        self, ids: list[int], room: int, key: object, scope: str = ""
    ) -> tuple[_Slot, int] | None:
        """The kept generator to reuse for `ids` (a request of `scope`), out of the cache,
        and how much of `ids` it holds."""
        with self._lock:
            index, common = self._choose(ids, room, key, scope)
            if index < 0:
                return None
            return self._entries.pop(index), common

    def put(
        self, prompt: list[int], generator: Any, max_length: int, key: object, scope: str = ""
    ) -> None:
        """Keep `generator`, whose cache holds `scope`'s `prompt` (the oldest entry may go)."""
        with self._lock:
            self._entries.append(_Slot(prompt, generator, max_length, key, scope))
            del self._entries[: max(0, len(self._entries) - self.slots)]

    def describe(self, kv_bytes_per_token: int, vocab_size: int) -> dict[str, Any]:
        """Its size, for /readyz and the load's log line: slots, tokens and memory each
        (a slot's KV cache, and the logits of its last prompt part: 64 positions at most)."""
        logits = KEPT_LOGITS_TOKENS * vocab_size * 4
        mib = (kv_bytes_per_token * self.max_tokens + logits) / 2**20
        return {
            "slots": self.slots,
            "tokens_per_slot": self.max_tokens,
            "mib_per_slot": round(mib, 1),
            "held": len(self._entries),
        }

    def evict(self, matches: Callable[[object], bool]) -> None:
        """Drop the kept generators whose key `matches` (e.g. those of one LoRA adapter,
        before it is unloaded)."""
        with self._lock:
            self._entries = [entry for entry in self._entries if not matches(entry.key)]

    def clear(self) -> None:
        """Drop every kept generator (their KV caches are freed)."""
        with self._lock:
            self._entries.clear()


def worth_sharing(common: int, held: int) -> bool:
    """Whether a kept prompt of `held` tokens that shares its first `common` with a new
    prompt is worth giving up to it while the cache has room for both: the new prompt
    saves `common` tokens of prefill now, and the kept one's conversation may prefill the
    `held - common` it loses later; at least `MIN_SHARED` are shared (a short common
    start, e.g. a chat template's first tokens, is not a shared prefix)."""
    return common >= MIN_SHARED and common >= held - common


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens `a` and `b` begin with alike."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i

"""The prompt cache's choice rule (core.prompt_cache), with stand-in generators: which
kept generator a prompt reuses, and from where (#28 items 3, 7)."""

from __future__ import annotations

from ortserve.core.generation import EffectiveSampling
from ortserve.core.prompt_cache import (
    MIN_APPENDED,
    MIN_SHARED,
    PromptCache,
    common_prefix,
    worth_sharing,
)

GREEDY = EffectiveSampling(0.0, 1.0, 0, 1.0)
PENALIZED = EffectiveSampling(0.0, 1.0, 0, 1.1)


def _cache(slots: int, *prompts: list[int], max_length: int = 100) -> PromptCache:
    cache = PromptCache(slots, max_tokens=max_length)
    for prompt in prompts:
        cache.put(prompt, object(), max_length, GREEDY)
    return cache


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5, 6], [5, 6, 7]) == 2


def test_a_whole_kept_prompt_is_reused_for_the_next_turn() -> None:
    turn1 = [1, 2, 3, 4]
    cache = _cache(2, [9, 9, 9], turn1)
    assert cache.match([*turn1, 5, 6, 7], 10, GREEDY) == 4
    taken = cache.take([*turn1, 5, 6, 7], 10, GREEDY)
    assert taken is not None and taken[0].prompt == turn1 and taken[1] == 4
    assert cache.describe(1, 1)["held"] == 1  # taken out until the request puts it back


def test_at_least_two_prompt_tokens_are_appended_again() -> None:
    # One appended token would go through the decode kernel (M = 1), whose rounding
    # differs from a prefill's: the same prompt again reuses all but MIN_APPENDED.
    cache = _cache(1, [1, 2, 3, 4, 5])
    assert cache.match([1, 2, 3, 4, 5], 10, GREEDY) == 5 - MIN_APPENDED
    assert cache.match([1, 2, 3, 4, 5, 6], 10, GREEDY) == 4


def test_with_room_left_a_short_partial_match_is_not_taken() -> None:
    # It would lose the kept conversation for little: a new generator keeps both.
    cache = _cache(2, [1, 2, 3, 4])
    assert cache.take([1, 2, 7, 8], 10, GREEDY) is None
    assert cache.match([1, 2, 7, 8], 10, GREEDY) == 0


SYSTEM = list(range(100, 100 + MIN_SHARED))  # a shared system prompt


def test_with_room_left_a_shared_system_prompt_is_reused_when_it_saves_more_than_it_loses() -> None:
    """A second conversation with the same system prompt reuses it (issue 54) when the
    cache has room: taking the kept one loses its own turn (og 0.18 cannot copy a KV
    cache), which is worth it only when it is no longer than what is shared."""
    ann = [*SYSTEM, 1, 2, 3]
    cache = _cache(4, ann, max_length=200)
    bob = [*SYSTEM, 7, 8, 9]
    assert cache.match(bob, 10, GREEDY) == MIN_SHARED
    taken = cache.take(bob, 10, GREEDY)
    assert taken is not None and taken[0].prompt == ann and taken[1] == MIN_SHARED
    # A long conversation is not given up for its system prompt while there is room.
    long_chat = [*SYSTEM, *range(1000, 1000 + MIN_SHARED + 1)]
    cache = _cache(4, long_chat, max_length=200)
    assert cache.take(bob, 10, GREEDY) is None
    # Nor is a shared start shorter than MIN_SHARED (a chat template's first tokens).
    assert worth_sharing(MIN_SHARED, 2 * MIN_SHARED)
    assert not worth_sharing(MIN_SHARED - 1, MIN_SHARED)
    assert not worth_sharing(MIN_SHARED, 2 * MIN_SHARED + 1)


def test_of_equal_shared_starts_the_one_that_loses_least_is_taken() -> None:
    short, longer = [*SYSTEM, 1], [*SYSTEM, 2, 2, 2]
    cache = _cache(4, longer, short, max_length=200)
    taken = cache.take([*SYSTEM, 5, 5], 10, GREEDY)
    assert taken is not None and taken[0].prompt == short
    cache = _cache(4, short, longer, max_length=200)
    taken = cache.take([*SYSTEM, 5, 5], 10, GREEDY)
    assert taken is not None and taken[0].prompt == short


def test_when_full_the_longest_partial_match_is_taken() -> None:
    cache = _cache(2, [1, 2, 3, 4], [1, 2, 3, 9, 9])
    taken = cache.take([1, 2, 3, 7, 8], 10, GREEDY)
    assert taken is not None and taken[1] == 3


def test_when_full_and_nothing_shared_the_oldest_buffer_is_reused_from_zero() -> None:
    cache = _cache(2, [1, 1], [2, 2])
    taken = cache.take([3, 3, 3], 10, GREEDY)
    assert taken is not None and taken[0].prompt == [1, 1] and taken[1] == 0


def test_another_scopes_prompt_is_never_a_hit_but_its_slot_is_capacity() -> None:
    # Issue 49: key B read key A's system prompt from `cached_tokens`, guess by guess.
    cache = PromptCache(2, max_tokens=100)
    cache.put([1, 2, 3, 4], object(), 100, GREEDY, scope="tenant-a")
    assert cache.match([1, 2, 3, 4, 5], 10, GREEDY, "tenant-b") == 0
    assert cache.take([1, 2, 3, 4, 5], 10, GREEDY, "tenant-b") is None  # room: a new one
    assert cache.match([1, 2, 3, 4, 5], 10, GREEDY, "tenant-a") == 5 - MIN_APPENDED
    cache.put([7, 7], object(), 100, GREEDY, scope="tenant-b")
    # Full: B's own entry shares nothing, and A's shares 4 tokens that B may not have. The
    # oldest (A's) KV buffer is taken from position 0: capacity, not content.
    taken = cache.take([1, 2, 3, 4, 5], 10, GREEDY, "tenant-b")
    assert taken is not None and taken[0].prompt == [1, 2, 3, 4] and taken[1] == 0


def test_other_search_options_or_too_little_room_never_match() -> None:
    cache = _cache(1, [1, 2, 3, 4], max_length=8)
    assert cache.take([1, 2, 3, 4, 5], 10, PENALIZED) is None
    assert cache.take([1, 2, 3, 4, 5], 9, GREEDY) is None  # its KV buffer is too small
    assert cache.take([1, 2, 3, 4, 5], 8, GREEDY) is not None


def test_the_least_recently_kept_goes_first() -> None:
    cache = _cache(2, [1], [2], [3])
    assert cache.describe(1, 1)["held"] == 2
    assert cache.take([1, 5, 5], 10, GREEDY) is not None  # full: [2] is the oldest now
    assert cache.describe(1, 1)["held"] == 1
    cache.clear()
    assert cache.describe(1, 1)["held"] == 0


def test_describe_states_a_slots_memory() -> None:
    cache = PromptCache(2, max_tokens=1024)
    # 1,024 tokens of 1 KiB each, and the logits of 64 positions of 256 float32s.
    assert cache.describe(1024, 256) == {
        "slots": 2,
        "tokens_per_slot": 1024,
        "mib_per_slot": round((1024 * 1024 + 64 * 256 * 4) / 2**20, 1),
        "held": 0,
    }

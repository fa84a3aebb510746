"""What tenant isolation costs one tenant, and what it stops: `python -m benchmarks.tenants`.

One edge daemon with two API keys (two tenants) and two prompt-cache slots. Each
repetition plays a greedy multi-turn chat with a ~1,000-token system prompt as tenant A
alone, then the same chat as tenants A' (a fresh conversation of A's key) and B turn by
turn, B sending exactly A's messages (the probing attack of issue 49). Prints, per turn,
the median TTFT and the cached tokens of A alone, and B's cached tokens: a single tenant's
hit rate and TTFT must not change with the isolation (run it on the commit before it for
the "before" figures), and B must read no cached token of A's prompt. Not a test: figures
for docs/measurements.md, from one run on a shared machine.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

import httpx

from benchmarks.prompt_cache import SYSTEM, _turn, chat_options, model_folder
from benchmarks.support.servers import daemon

KEYS = ("tenant-a", "tenant-b")


def _client(key: str) -> httpx.Client:
    return httpx.Client(timeout=600, headers={"authorization": f"Bearer {key}"})


def _play(
    base: str, players: list[httpx.Client], chat: int, turns: int, tokens: int
) -> list[list[tuple[float, int]]]:
    """Chat number `chat`, of `turns` turns, each player sending the same messages in turn
    (the first player's answers are fed back); (TTFT, cached tokens) per player and turn."""
    system = f"Conversation {chat}. {SYSTEM}"  # a new chat: nothing of it is cached yet
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    seen: list[list[tuple[float, int]]] = [[] for _ in players]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn + 1}: what can you do?"})
        answer = ""
        for i, client in enumerate(players):
            ttft, text, cached = _turn(client, base, messages, tokens)
            seen[i].append((ttft, cached))
            answer = answer or text
        messages.append({"role": "assistant", "content": answer})
    return seen


def main() -> None:
    """Run the benchmark and print the table."""
    args = chat_options(__doc__, turns=5, tokens=16)
    model_dir = model_folder(args)
    env = {
        **os.environ,
        "ORTSERVE_THREADS": str(args.threads),
        "ORTSERVE_PROVIDERS": "cpu",
        "ORTSERVE_API_KEYS": ",".join(KEYS),
        "ORTSERVE_PROMPT_CACHE_SLOTS": "2",
    }
    alone: list[list[tuple[float, int]]] = []
    probed: list[list[tuple[float, int]]] = []
    with daemon(model_dir, env) as (base, _), _client(KEYS[0]) as a, _client(KEYS[1]) as b:
        for rep in range(args.reps):
            alone.append(_play(base, [a], 2 * rep, args.turns, args.tokens)[0])
            probed.append(_play(base, [a, b], 2 * rep + 1, args.turns, args.tokens)[1])
    print(
        f"{args.model}: {args.turns} turns, {args.tokens} new tokens each, {args.threads} "
        f"threads, 2 cache slots, medians of {args.reps}"
    )
    # B's first turn is the probe: A' (A's key) has just sent the same prompt; B's own
    # earlier chats share only the template's first tokens with it.
    print("turn  A alone: cached  TTFT     B right after A's same messages: cached  TTFT")
    for turn in range(args.turns):
        a_ttft = statistics.median(r[turn][0] for r in alone) * 1000
        b_ttft = statistics.median(r[turn][0] for r in probed) * 1000
        print(
            f"{turn + 1:>4}  {alone[-1][turn][1]:>15}  {a_ttft:>4.0f} ms"
            f"  {probed[-1][turn][1]:>30}  {b_ttft:>4.0f} ms"
        )


if __name__ == "__main__":
    main()

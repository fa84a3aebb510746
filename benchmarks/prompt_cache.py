"""Chats with and without the prompt cache: `python -m benchmarks.prompt_cache`.

Two edge daemons on the same model, ORTSERVE_PROMPT_CACHE_SLOTS=`--slots` (1) and 0. Each
repetition plays the scenario against each (the order alternates), streaming every
request and timing its TTFT (request sent → first SSE event); the answers are fed back as
the conversations go. `--scenario chat`: one chat of `--turns` turns with a ~1,000-token
system prompt; `--scenario shared`: `--users` chats with that system prompt, `--turns`
turns each, their turns interleaved (user 1's first, user 2's first, ...). `--sampling
greedy` sends temperature 0; `defaults` sends no sampling field (the model's own: Qwen's
sample). Prints the median TTFT per request, the ratio, and whether both daemons gave the
same answers (they must where the answers are greedy). Not a test: figures for
docs/measurements.md, from one run on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.bakes import baked
from benchmarks.support.servers import daemon

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = " ".join(
    ["You are the assistant of an edge board that serves a small language model."] * 70
)


SAMPLINGS: dict[str, dict[str, Any]] = {"greedy": {"temperature": 0}, "defaults": {}}
Row = tuple[float, str, int]  # TTFT (s), answer, cached tokens


def _turn(
    client: httpx.Client,
    base: str,
    messages: list[dict[str, Any]],
    tokens: int,
    sampling: dict[str, Any] | None = None,
) -> Row:
    body = {
        "messages": messages,
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(SAMPLINGS["greedy"] if sampling is None else sampling),
    }
    start = time.perf_counter()
    first = 0.0
    text, cached = "", 0
    with client.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event["choices"] and event["choices"][0]["delta"].get("content"):
                first = first or time.perf_counter() - start
                text += event["choices"][0]["delta"]["content"]
            if event.get("usage"):
                cached = event["usage"]["prompt_tokens_details"]["cached_tokens"]
    # An answer with no text (EOS first: a base model may): its time to the end instead.
    return first or time.perf_counter() - start, text, cached


def _chat(
    client: httpx.Client,
    base: str,
    turns: int,
    tokens: int,
    sampling: dict[str, Any] | None = None,
    users: int = 1,
) -> list[Row]:
    """`users` chats of `turns` turns with one system prompt, their turns interleaved."""
    chats: list[list[dict[str, Any]]] = [
        [{"role": "system", "content": SYSTEM}] for _ in range(users)
    ]
    out = []
    for turn in range(turns):
        for user, messages in enumerate(chats):
            who = f"I am user {user + 1}. " if users > 1 else ""
            question = f"{who}Question {turn + 1}: what can you do?"
            messages.append({"role": "user", "content": question})
            out.append(_turn(client, base, messages, tokens, sampling))
            messages.append({"role": "assistant", "content": out[-1][1]})
    return out


def chat_options(doc: str | None, turns: int, tokens: int) -> argparse.Namespace:
    """The command line of a multi-turn chat benchmark (this one's, benchmarks.tenants')."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--model", default="builtin:smollm2-135m-shape")
    parser.add_argument("--model-dir", type=Path, help="a baked model folder (default: bake)")
    parser.add_argument("--turns", type=int, default=turns)
    parser.add_argument("--tokens", type=int, default=tokens, help="new tokens per turn")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench")
    parser.add_argument("--sampling", choices=sorted(SAMPLINGS), default="greedy")
    parser.add_argument("--scenario", choices=["chat", "shared"], default="chat")
    parser.add_argument("--users", type=int, default=4, help="chats of --scenario shared")
    parser.add_argument("--slots", type=int, default=1, help="the cached daemon's slots")
    return parser.parse_args()


def model_folder(args: argparse.Namespace) -> Path:
    """The model folder `chat_options` name: `--model-dir`, or `--model` baked."""
    folder: Path = args.model_dir or baked(args.work, args.model, "edge-x86_64", package=False)
    return folder if args.model_dir else folder / "model"


def main() -> None:
    """Run the benchmark and print the table."""
    args = chat_options(__doc__, turns=6, tokens=32)
    model_dir = model_folder(args)
    env = {**os.environ, "ORTSERVE_THREADS": str(args.threads), "ORTSERVE_PROVIDERS": "cpu"}
    users = args.users if args.scenario == "shared" else 1
    sampling = SAMPLINGS[args.sampling]
    runs: dict[str, list[list[Row]]] = {"cache": [], "none": []}
    cached_env = {**env, "ORTSERVE_PROMPT_CACHE_SLOTS": str(args.slots)}
    with (
        daemon(model_dir, cached_env) as (on, _),
        daemon(model_dir, {**env, "ORTSERVE_PROMPT_CACHE_SLOTS": "0"}) as (off, _),
        httpx.Client(timeout=600) as client,
    ):
        for rep in range(args.reps):
            order = [("cache", on), ("none", off)]
            for name, base in order if rep % 2 == 0 else order[::-1]:
                runs[name].append(_chat(client, base, args.turns, args.tokens, sampling, users))
    same = all(
        [t[1] for t in a] == [t[1] for t in b]
        for a, b in zip(runs["cache"], runs["none"], strict=True)
    )
    print(
        f"{args.model}: {args.scenario}, {users} user(s) x {args.turns} turns, "
        f"{args.tokens} new tokens each, sampling {args.sampling}, {args.slots} slot(s), "
        f"{args.threads} threads, medians of {args.reps}; same answers: {same}"
    )
    print("request        cached tokens  TTFT with cache  without  ratio")
    for i in range(len(runs["cache"][0])):
        with_cache = statistics.median(r[i][0] for r in runs["cache"]) * 1000
        without = statistics.median(r[i][0] for r in runs["none"]) * 1000
        cached = statistics.median(r[i][2] for r in runs["cache"])
        turn, user = divmod(i, users)
        label = f"turn {turn + 1}" + (f", user {user + 1}" if users > 1 else "")
        print(
            f"{label:<15}{cached:>13.0f}  {with_cache:>12.0f} ms  {without:>6.0f} ms"
            f"  {with_cache / without:5.2f}"
        )


if __name__ == "__main__":
    main()

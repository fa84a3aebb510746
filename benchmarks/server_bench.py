"""The edge daemon against the bare engine, same model: `python -m benchmarks.server_bench`.

Alternates (A/B/A/B...) one streamed generation through the real daemon (`ortserve serve`,
an SSE client over one keep-alive loopback connection: TTFT from sending the request to
the first event, decode
tokens/s from the first event to the final one) and one through the engine in this
process (`Engine.stream`, the same call the daemon makes: TTFT from the call to the first
delta). Both generate from the same prompt (about `--prompt-tokens` tokens) with greedy
decoding; the random 135M-shape model practically never emits EOS, and the token counts
come from the responses. Prints medians and the ratios; `--json` writes everything.
Not a test: this machine is shared and noisy, so read ratios from one run.
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
from core.engine import Engine
from core.generation import GenerationRequest, SamplingOptions
from core.settings import EngineSettings

ROOT = Path(__file__).resolve().parents[1]
WORDS = [
    "edge",
    "boards",
    "run",
    "a",
    "daemon",
    "under",
    "systemd",
    "and",
    "answer",
    "on",
    "the",
    "network",
    "quickly",
]


def _prompt(engine: Engine, tokens: int) -> str:
    words: list[str] = []
    while len(engine.encode(" ".join(words))) < tokens:
        words.append(WORDS[len(words) % len(WORDS)])
    return " ".join(words)


def _server_run(client: httpx.Client, base: str, prompt: str, new_tokens: int) -> dict[str, float]:
    body = {"prompt": prompt, "max_new_tokens": new_tokens, "temperature": 0, "stream": True}
    start = time.perf_counter()
    first = 0.0
    with client.stream("POST", f"{base}/generate", json=body) as response:
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            now = time.perf_counter()
            if not first:
                first = now
            if event.get("done"):
                tokens = event["tokens_generated"]
                return {"ttft_s": first - start, "decode_tps": (tokens - 1) / (now - first)}
    raise RuntimeError("the stream ended without its final event")


def _engine_run(engine: Engine, prompt: str, new_tokens: int) -> dict[str, float]:
    options = SamplingOptions(max_new_tokens=new_tokens)
    start = time.perf_counter()
    stream = engine.stream(GenerationRequest(prompt=prompt, options=options))
    first = 0.0
    for _ in stream:
        if not first:
            first = time.perf_counter()
    end = time.perf_counter()
    done = stream.completion
    assert done is not None
    return {"ttft_s": first - start, "decode_tps": (done.completion_tokens - 1) / (end - first)}


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="builtin:smollm2-135m-shape")
    parser.add_argument("--model-dir", type=Path, help="a baked model folder (default: bake)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    model_dir = (
        args.model_dir or baked(args.work, args.model, "edge-x86_64", package=False) / "model"
    )
    engine = Engine.load(EngineSettings(model_dir=model_dir, providers="cpu", threads=args.threads))
    prompt = _prompt(engine, args.prompt_tokens)
    env = {**os.environ, "ORTSERVE_THREADS": str(args.threads), "ORTSERVE_PROVIDERS": "cpu",
           "ORTSERVE_MAX_NEW_TOKENS": str(args.new_tokens)}  # fmt: skip
    runs: dict[str, list[dict[str, float]]] = {"server": [], "engine": []}
    # One keep-alive connection, as HTTP clients (openai's included) use.
    with daemon(model_dir, env) as (base, _), httpx.Client(timeout=300) as client:
        _server_run(client, base, prompt, args.new_tokens)  # warm-up both
        _engine_run(engine, prompt, args.new_tokens)
        for _ in range(args.reps):
            runs["server"].append(_server_run(client, base, prompt, args.new_tokens))
            runs["engine"].append(_engine_run(engine, prompt, args.new_tokens))
    med: dict[str, dict[str, Any]] = {
        k: {m: statistics.median(r[m] for r in v) for m in ("ttft_s", "decode_tps")}
        for k, v in runs.items()
    }
    prompt_len = len(engine.encode(prompt))
    print(f"{args.model}: prompt {prompt_len} tokens, {args.new_tokens} new, "
          f"{args.threads} threads, medians of {args.reps} alternating runs")  # fmt: skip
    for name in ("engine", "server"):
        row = med[name]
        ttft_ms, tps = row["ttft_s"] * 1000, row["decode_tps"]
        print(f"  {name:<7} TTFT {ttft_ms:7.2f} ms   decode {tps:7.1f} tok/s")
    ratio = med["server"]["decode_tps"] / med["engine"]["decode_tps"]
    overhead_ms = (med["server"]["ttft_s"] - med["engine"]["ttft_s"]) * 1000
    print(f"  server decode / engine decode = {ratio:.3f} (goal >= 0.97)")
    print(f"  server TTFT - engine TTFT     = {overhead_ms:+.2f} ms (goal <= 5 ms)")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "medians": med, "decode_ratio": ratio,
                                         "ttft_overhead_ms": overhead_ms}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()

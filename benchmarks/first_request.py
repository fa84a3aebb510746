"""The first request after a start, with and without the warm-up generation:
`python -m benchmarks.first_request [--reps 5] [--model-dir DIR]`.

Each repetition starts the edge daemon twice, alternating ORTSERVE_WARMUP=1 and 0 (the
order flips every repetition), waits for /readyz 200 (which, with warm-up, comes after
the warm-up generation), then times the first streamed /generate (TTFT and total, 32
greedy tokens from a ~20-token prompt) and a second one, and the start-to-ready time.
Prints medians. Not a test: this machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import httpx

from benchmarks.bakes import baked
from benchmarks.support.servers import daemon

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Edge boards run a daemon under systemd and answer on the network quickly, as"


def _timed(client: httpx.Client, base: str, tokens: int) -> tuple[float, float]:
    body = {"prompt": PROMPT, "max_new_tokens": tokens, "stream": True}
    start = time.perf_counter()
    first = 0.0
    with client.stream("POST", f"{base}/generate", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and not first:
                first = time.perf_counter() - start
    return first, time.perf_counter() - start


def _run(model_dir: Path, warmup: bool, threads: int, tokens: int) -> dict[str, float]:
    env = {
        **os.environ,
        "ORTSERVE_WARMUP": "1" if warmup else "0",
        "ORTSERVE_THREADS": str(threads),
        "ORTSERVE_PROVIDERS": "cpu",
    }
    start = time.perf_counter()
    with daemon(model_dir, env) as (base, _), httpx.Client(timeout=120) as client:
        ready = time.perf_counter() - start
        ttft1, total1 = _timed(client, base, tokens)
        ttft2, total2 = _timed(client, base, tokens)
    return {
        "ready_s": ready,
        "first_ttft_s": ttft1,
        "first_total_s": total1,
        "second_ttft_s": ttft2,
        "second_total_s": total2,
    }


def main() -> None:
    """Run the benchmark and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="builtin:smollm2-135m-shape")
    parser.add_argument("--model-dir", type=Path, help="a baked model folder (default: bake)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    model_dir = (
        args.model_dir or baked(args.work, args.model, "edge-x86_64", package=False) / "model"
    )
    runs: dict[str, list[dict[str, float]]] = {"warm-up": [], "none": []}
    for rep in range(args.reps):
        order = (True, False) if rep % 2 == 0 else (False, True)
        for warmup in order:
            result = _run(model_dir, warmup, args.threads, args.tokens)
            runs["warm-up" if warmup else "none"].append(result)
    print(f"{model_dir}: {args.tokens} tokens, {args.threads} threads, medians of {args.reps}")
    for name, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) * 1000 for k in results[0]}
        first = f"TTFT {med['first_ttft_s']:6.1f} ms, total {med['first_total_s']:6.1f} ms"
        second = f"TTFT {med['second_ttft_s']:6.1f} ms, total {med['second_total_s']:6.1f} ms"
        print(f"  {name:<8} ready {med['ready_s']:7.0f} ms   first {first}   second {second}")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()

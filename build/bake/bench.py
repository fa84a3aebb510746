"""Measure bake options on a real-shape random model: `python -m ortserve.bake.bench`.

Bakes builtin:smollm2-135m-shape with each int4 block size, then alternates runs
(A/B/A/B...) of prefill (prompt 128 and 512 tokens, one new token) and decode (128
forced new tokens) with 1 and 2 intra-op threads, and prints medians and ratios
measured in this one run. Not a test: this machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from ortserve.bake.pipeline import BakeRequest, bake
from ortserve.core.engine import Engine, SamplingOptions
from ortserve.core.settings import EngineSettings


def _prefill(engine: Engine, prompt_len: int) -> float:
    ids = [(i * 7919) % 40000 + 300 for i in range(prompt_len)]
    start = time.perf_counter()
    next(iter(engine.stream_tokens(ids, SamplingOptions(max_new_tokens=1, min_new_tokens=1))))
    return prompt_len / (time.perf_counter() - start)


def _decode(engine: Engine, new_tokens: int) -> float:
    ids = [(i * 7919) % 40000 + 300 for i in range(128)]
    stream = engine.stream_tokens(ids, SamplingOptions(new_tokens, new_tokens))
    next(stream)
    start = time.perf_counter()
    count = sum(1 for _ in stream)
    return count / (time.perf_counter() - start)


def main() -> None:
    """Run the benchmark and print (and optionally save) the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="builtin:smollm2-135m-shape")
    parser.add_argument("--blocks", default="32,128")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path(".cache/bench"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    variants: dict[str, Engine] = {}
    for block in args.blocks.split(","):
        out = args.work / f"block{block}"
        if not (out / "model" / "manifest.json").is_file():
            bake(
                BakeRequest(
                    args.model,
                    "edge-x86_64",
                    out=out,
                    options={"block_size": block},
                    force=True,
                    package=False,
                )
            )
        for threads in args.threads.split(","):
            settings = EngineSettings(
                model_dir=out / "model", providers="cpu", threads=int(threads)
            )
            variants[f"block {block}, {threads} thr"] = Engine.load(settings)
    results: dict[str, dict[str, list[float]]] = {k: {} for k in variants}
    for _ in range(args.reps):
        for name, engine in variants.items():  # alternate variants inside each repetition
            runs = {
                "prefill128": _prefill(engine, 128),
                "prefill512": _prefill(engine, 512),
                "decode": _decode(engine, 128),
            }
            for metric, value in runs.items():
                results[name].setdefault(metric, []).append(value)
    medians = {n: {m: statistics.median(v) for m, v in r.items()} for n, r in results.items()}
    base = next(iter(medians.values()))
    print(f"{args.model}: medians of {args.reps} alternating runs, tokens/s (ratio to first row)")
    print(f"{'variant':<20} {'prefill 128':>18} {'prefill 512':>18} {'decode':>18}")
    for name, row in medians.items():
        cells = [
            f"{row[m]:8.1f} ({row[m] / base[m]:4.2f}x)"
            for m in ("prefill128", "prefill512", "decode")
        ]
        print(f"{name:<20} {cells[0]:>18} {cells[1]:>18} {cells[2]:>18}")
    if args.json:
        args.json.write_text(json.dumps({"medians": medians, "runs": results}, indent=2))


if __name__ == "__main__":
    main()

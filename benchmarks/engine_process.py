"""The engine process's cost and gain: the edge daemon with og in-process and in its own
process (ORTSERVE_ENGINE_PROCESS=0/1), side by side.

Run: `python -m benchmarks.engine_process [--model builtin:qwen2.5-0.5b-shape]
[--reps 2] [--long 8000] [--clients 4] [--probe-ms 10] [--json PATH]`. It writes
benchmarks/results/engine_process-YYYY-MM-DD.json (unless `--json`) and prints a Markdown
table. Not a test: figures for docs/measurements.md, from one run on a shared machine.

Model: `--model` (default: random weights in Qwen2.5-0.5B's shape, the size the issue
names), baked with `ortserve bake --target edge-x86_64 --model-only` under `--work`
(`benchmarks.bakes.baked`). Prompts: token ids drawn with a fixed seed from the
vocabulary's plain words, whose text tokenizes back to exactly those ids
(`benchmarks.long_prompt.make_prompt`).

Each repetition starts one daemon per variant, in turn (the order reversed on odd
repetitions), with ORTSERVE_THREADS=2, PROVIDERS=cpu, PROMPT_CACHE_SLOTS=0,
MAX_CONCURRENCY=`--clients`, MAX_BATCH=1 (each long prompt prefills in its own parts, side
by side) and the other settings at their defaults, and measures, after one warm-up
request:

- decode: one streamed /v1/completions of a 128-token prompt with 128 forced new tokens
  (`ignore_eos`), tokens/s between the first and the last token event (median of
  `--decode-reps`); TTFT of the same requests (request sent -> first token);
- probes under load: `--clients` concurrent streamed completions of `--long`-token
  prompts (1 new token each) while a thread of its own GETs /healthz every 10 ms, from
  the moment the first long request is sent until the last one ends: p50, p99, max and
  the count of the samples; a failed sample (not 200) counts as infinite. `--probe-ms 0`
  sends no probes: the probes cost the daemon CPU (~1 ms each), which a variant that
  answers them 100x as often pays in prefill time.

The machine is shared: before each measurement it waits (up to `--quiet-wait` s) until
other processes use at most `--max-other-load` cores (`benchmarks.machine_load`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.bakes import baked
from benchmarks.long_prompt import Stream, make_prompt, sample_health, stream_completion, token_pool
from benchmarks.machine_load import wait_quiet
from benchmarks.support.servers import daemon

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"in-process": "0", "engine process": "1"}
PROBE_PERIOD_S = 0.01
DECODE_PROMPT, DECODE_NEW = 128, 128


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def measure_decode(base: str, text: str, reps: int) -> dict[str, float]:
    """Median decode tokens/s and TTFT of `reps` forced 128-token completions."""
    speeds, ttfts = [], []
    with httpx.Client(timeout=600) as client:
        for _ in range(reps):
            out = Stream()
            stream_completion(client, base, text, DECODE_NEW, out, ignore_eos=True)
            if out.error or out.completion_tokens != DECODE_NEW:
                raise SystemExit(f"decode request failed: {out.error or out.completion_tokens}")
            speeds.append((out.completion_tokens - 1) / (out.last_s - out.ttft_s))
            ttfts.append(out.ttft_s)
    return {"decode_tps": statistics.median(speeds), "ttft_ms": statistics.median(ttfts) * 1000}


def measure_probes(base: str, texts: list[str], period_s: float) -> dict[str, Any]:
    """/healthz latency while `texts` prefill side by side (one new token each); with a
    `period_s` of 0, no probes (the prefill's own time, without the probes' CPU)."""
    samples: list[float] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_health, args=(base, stop, samples, period_s))
    if period_s > 0:
        sampler.start()
        while not samples:  # connected
            time.sleep(0.001)
    outs = [Stream() for _ in texts]

    def ask(text: str, out: Stream) -> None:
        with httpx.Client(timeout=1200) as client:
            stream_completion(client, base, text, 1, out)

    askers = [threading.Thread(target=ask, args=pair) for pair in zip(texts, outs, strict=True)]
    start = time.perf_counter()
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join()
    seconds = time.perf_counter() - start
    stop.set()
    if period_s > 0:
        sampler.join()
    errors = [o.error for o in outs if o.error]
    health = [s for s in samples if s >= 0]
    return {
        "probe_p50_ms": _pct(health, 0.5) * 1000,
        "probe_p99_ms": _pct(health, 0.99) * 1000,
        "probe_max_ms": max(health) * 1000 if health else math.nan,
        "probes": len(health),
        "prefill_s": seconds,
        "prompt_tokens": [o.prompt_tokens for o in outs],
        "errors": errors,
    }


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:qwen2.5-0.5b-shape")
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench", help="cache")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--decode-reps", type=int, default=3)
    parser.add_argument("--long", type=int, default=8000, help="tokens of each long prompt")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--probe-ms", type=float, default=PROBE_PERIOD_S * 1000, help="0: no probes"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--max-other-load", type=float, default=0.3)
    parser.add_argument("--quiet-wait", type=float, default=60)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; print the table and write the JSON report."""
    args = _parse_args(argv)
    model_dir = baked(args.work, args.model, "edge-x86_64", package=False) / "model"
    pool = token_pool(model_dir)
    short = make_prompt(model_dir, pool, DECODE_PROMPT, seed=1).text
    longs = [make_prompt(model_dir, pool, args.long, seed=10 + i).text for i in range(args.clients)]
    env_base = {
        k: v for k, v in os.environ.items() if not k.startswith(("ORTSERVE_", "NOTIFY_"))
    } | {
        "ORTSERVE_THREADS": "2",
        "ORTSERVE_PROVIDERS": "cpu",
        "ORTSERVE_PROMPT_CACHE_SLOTS": "0",
        "ORTSERVE_MAX_CONCURRENCY": str(args.clients),
        "ORTSERVE_MAX_BATCH": "1",
        "ORTSERVE_LOG_LEVEL": "WARNING",
    }
    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        order = list(VARIANTS.items())
        for name, flag in order if rep % 2 == 0 else order[::-1]:
            env = env_base | {"ORTSERVE_ENGINE_PROCESS": flag}
            with daemon(model_dir, env) as (base, _proc):
                measure_decode(base, short, 1)  # warm-up
                wait_quiet(args.quiet_wait, args.max_other_load)
                decode = measure_decode(base, short, args.decode_reps)
                wait_quiet(args.quiet_wait, args.max_other_load)
                probes = measure_probes(base, longs, args.probe_ms / 1000)
            run = {"variant": name, "rep": rep, **decode, **probes}
            print(json.dumps(run), flush=True)
            runs.append(run)
    rows = []
    for name in VARIANTS:
        mine = [r for r in runs if r["variant"] == name]
        rows.append(
            {
                "variant": name,
                "decode_tps": statistics.median(r["decode_tps"] for r in mine),
                "ttft_ms": statistics.median(r["ttft_ms"] for r in mine),
                "probe_p50_ms": statistics.median(r["probe_p50_ms"] for r in mine),
                "probe_p99_ms": statistics.median(r["probe_p99_ms"] for r in mine),
                "probe_max_ms": max(r["probe_max_ms"] for r in mine),
                "prefill_s": statistics.median(r["prefill_s"] for r in mine),
            }
        )
    print(
        f"\n| variant | decode tok/s | TTFT ms ({DECODE_PROMPT} tok) | /healthz p50 / p99 / "
        f"max ms during {args.clients} x {args.long}-token prefills | those prefills, s |"
    )
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['variant']} | {row['decode_tps']:.1f} | {row['ttft_ms']:.0f} | "
            f"{row['probe_p50_ms']:.1f} / {row['probe_p99_ms']:.1f} / {row['probe_max_ms']:.1f} "
            f"| {row['prefill_s']:.1f} |"
        )
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    path = args.json or ROOT / "benchmarks" / "results" / f"engine_process-{today}.json"
    report = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs, "rows": rows}
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()

"""Load and soak against the real edge daemon: `python -m benchmarks.load`.

- Load: for each N in `--clients` (default 1,2,4,8,16), N closed-loop clients stream
  `/v1/chat/completions` for `--seconds` each; reports requests/s, total tokens/s, TTFT and
  latency p50/p99, 503s (each must carry Retry-After), any other error (must be 0), and
  the daemon's peak RSS (VmHWM; its engine process's added). `--plot FILE.png` draws
  throughput and p99 vs N.
- Soak (`--soak N`): N requests in a row; the daemon's RSS after the first 10% and after
  the last must differ by less than 5%.
- Single-request A/B (`--ab KEY=VALUE --ab-requests N`): a second daemon runs with that
  setting changed (e.g. `ORTSERVE_MAX_BATCH=1`, batching off); one client sends N
  requests to each, alternating A B, B A, A B... with a pause between, and reports both
  medians and the median of the paired latency ratios (B's request beside A's, seconds
  apart): what a setting costs a lone client, with the machine's drift paired out. Two
  rounds of N/2, each config's daemon started first once, and the geometric mean of the
  two ratios: two identical daemons here differ by up to 10% (an A/A run shows it).

Everything stays on 127.0.0.1 and stops by itself. Not a test: figures for docs/measurements.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.support.servers import daemon, daemon_pids, memory_kib
from ortserve.core.manifest import read_manifest

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Tally:
    """What the clients of one load level saw."""

    ttft_s: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    tokens: int = 0
    busy: int = 0
    busy_without_retry_after: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _one(client: httpx.Client, base: str, max_tokens: int, tally: Tally) -> None:
    body = {
        "messages": [{"role": "user", "content": "Tell me about edge boards."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = 0.0
    tokens = 0
    try:
        with client.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
            if response.status_code == 503:
                response.read()
                with tally.lock:
                    tally.busy += 1
                    tally.busy_without_retry_after += "retry-after" not in response.headers
                return
            if response.status_code != 200:
                with tally.lock:
                    tally.errors.append(f"{response.status_code}: {response.read()[:200]!r}")
                return
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(f"stream error: {event['error']}")
                if not first and event["choices"] and event["choices"][0]["delta"].get("content"):
                    first = time.perf_counter()
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
    except (httpx.HTTPError, RuntimeError) as exc:
        with tally.lock:
            tally.errors.append(repr(exc))
        return
    end = time.perf_counter()
    with tally.lock:
        tally.ttft_s.append((first or end) - start)
        tally.latency_s.append(end - start)
        tally.tokens += tokens


def _level(base: str, clients: int, seconds: float, max_tokens: int) -> dict[str, Any]:
    tally = Tally()
    deadline = time.monotonic() + seconds

    def loop() -> None:
        with httpx.Client(timeout=120) as client:
            while time.monotonic() < deadline:
                _one(client, base, max_tokens, tally)

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start

    def pct(values: list[float], q: int) -> float:
        return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else float("nan")

    return {
        "clients": clients,
        "requests_per_s": len(tally.latency_s) / elapsed,
        "tokens_per_s": tally.tokens / elapsed,
        "ttft_p50_ms": pct(tally.ttft_s, 50) * 1000,
        "ttft_p99_ms": pct(tally.ttft_s, 99) * 1000,
        "latency_p50_ms": pct(tally.latency_s, 50) * 1000,
        "latency_p99_ms": pct(tally.latency_s, 99) * 1000,
        "busy_503": tally.busy,
        "busy_without_retry_after": tally.busy_without_retry_after,
        "other_errors": len(tally.errors),
        "error_samples": tally.errors[:3],
    }


def _soak(base: str, pids: list[int], count: int, max_tokens: int) -> dict[str, Any]:
    tally = Tally()
    step = max(1, count // 10)
    samples: list[int] = []  # RSS after every tenth of the requests, to tell growth from noise
    with httpx.Client(timeout=120) as client:
        for i in range(count):
            _one(client, base, max_tokens, tally)
            if (i + 1) % step == 0:
                samples.append(memory_kib(pids, "VmRSS"))
    early, late = samples[0], memory_kib(pids, "VmRSS")
    return {
        "requests": count,
        "rss_early_kib": early,
        "rss_late_kib": late,
        "growth": late / early - 1,
        "rss_kib_every_tenth": samples,
        "errors": len(tally.errors) + tally.busy,
    }


def _ab(base_a: str, base_b: str, count: int, max_tokens: int) -> dict[str, Any]:
    tallies = (Tally(), Tally())
    with httpx.Client(timeout=120) as client:
        for i in range(count):
            order = [(base_a, tallies[0]), (base_b, tallies[1])]
            for base, tally in order if i % 2 == 0 else order[::-1]:  # ABBA: no order bias
                _one(client, base, max_tokens, tally)
                time.sleep(0.05)  # let the other daemon's onnxruntime threads stop spinning
    a, b = tallies
    ratios = [x / y for x, y in zip(a.latency_s, b.latency_s, strict=False)]
    ttft = [x - y for x, y in zip(a.ttft_s, b.ttft_s, strict=False)]
    return {
        "requests": count,
        "a_latency_p50_ms": statistics.median(a.latency_s) * 1000,
        "b_latency_p50_ms": statistics.median(b.latency_s) * 1000,
        "a_ttft_p50_ms": statistics.median(a.ttft_s) * 1000,
        "b_ttft_p50_ms": statistics.median(b.ttft_s) * 1000,
        "latency_a_over_b_paired": statistics.median(ratios),
        "ttft_a_minus_b_paired_ms": statistics.median(ttft) * 1000,
        "errors": len(a.errors) + len(b.errors) + a.busy + b.busy,
    }


def _plot(levels: list[dict[str, Any]], path: Path, model: str, run: str) -> None:
    """Throughput and p99 latency against the number of clients, on the clients' own
    values (1, 2, 4, ...), with a legend; the title names the model and `run` how."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [lv["clients"] for lv in levels]
    fig, left = plt.subplots(figsize=(7, 4.4))
    throughput = left.plot(
        n,
        [lv["tokens_per_s"] for lv in levels],
        "o-",
        color="tab:blue",
        label="throughput, all clients (tokens/s, left)",
    )
    left.set_xlabel("concurrent streaming clients")
    left.set_ylabel("tokens/s", color="tab:blue")
    left.set_xscale("log", base=2)
    left.set_xticks(n, [str(c) for c in n])  # 1, 2, 4, 8, 16 rather than 2⁰...2⁴
    left.minorticks_off()
    left.set_ylim(bottom=0)
    left.grid(True, alpha=0.3)
    right = left.twinx()
    latency = right.plot(
        n,
        [lv["latency_p99_ms"] for lv in levels],
        "s--",
        color="tab:red",
        label="p99 request latency (ms, right)",
    )
    right.set_ylabel("p99 latency (ms)", color="tab:red")
    right.set_ylim(bottom=0)
    lines = throughput + latency
    left.legend(
        lines,
        [str(line.get_label()) for line in lines],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        ncol=2,
        frameon=False,
    )
    left.set_title(f"ortserve edge daemon on {model}\n{run}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    """Start the daemon, run the load levels (and the soak), print a table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path, required=True, help="a baked model folder")
    parser.add_argument("--clients", default="1,2,4,8,16")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--soak", type=int, default=0, help="requests in a row (0: none)")
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the daemon")
    parser.add_argument("--ab", action="append", default=[], help="KEY=VALUE for daemon B")
    parser.add_argument("--ab-requests", type=int, default=30)
    args = parser.parse_args()
    env = {**os.environ, "ORTSERVE_PROVIDERS": "cpu", **dict(kv.split("=", 1) for kv in args.env)}
    result: dict[str, Any] = {"levels": []}
    if args.ab:
        env_b = {**env, **dict(kv.split("=", 1) for kv in args.ab)}
        rounds = []
        for first, second in ((env, env_b), (env_b, env)):  # each config started first once
            with (
                daemon(args.model_dir, first) as (one, _),
                daemon(args.model_dir, second) as (two, _),
            ):
                base_a, base_b = (one, two) if first is env else (two, one)
                rounds.append(_ab(base_a, base_b, args.ab_requests // 2, args.max_tokens))
        ratios = [r["latency_a_over_b_paired"] for r in rounds]
        result["ab"] = {"rounds": rounds, "latency_a_over_b": math.sqrt(ratios[0] * ratios[1])}
        print(json.dumps({"b": args.ab, **result["ab"]}), flush=True)
    with daemon(args.model_dir, env) as (base, proc):
        for clients in (int(c) for c in args.clients.split(",") if c):
            level = _level(base, clients, args.seconds, args.max_tokens)
            level["peak_rss_mib"] = memory_kib(daemon_pids(base, proc.pid), "VmHWM") / 1024
            result["levels"].append(level)
            print(
                json.dumps(
                    {k: round(v, 1) if isinstance(v, float) else v for k, v in level.items()}
                ),
                flush=True,
            )
        if args.soak:
            result["soak"] = _soak(base, daemon_pids(base, proc.pid), args.soak, args.max_tokens)
            print(json.dumps(result["soak"]), flush=True)
    if args.plot and result["levels"]:
        run = (
            f"N closed-loop clients, {args.max_tokens}-token greedy chats, {args.seconds:g} s per N"
        )
        _plot(
            result["levels"],
            args.plot,
            read_manifest(args.model_dir).model_name,
            run + "".join(f", {kv}" for kv in args.env),
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

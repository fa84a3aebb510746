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

- Beside llama.cpp (`--llama-server BIN --gguf FILE`): at each N, the same N clients
  send the same requests to the daemon and to `llama-server --parallel N` (continuous
  batching) on the same GGUF, the two alternating (the daemon first at odd levels), each
  client `--requests` long-prompt chats in turn (`--prompt-tokens`, about 100 to 2,000 tokens
  of the Python reference manual each, every prompt different, so neither server's prompt
  cache helps) of `--max-tokens` forced new tokens (`ignore_eos`, as both servers take it):
  aggregate decode tokens/s (generated tokens over the level's wall time), TTFT p50/p99,
  each server's peak RSS, and the batches the daemon ran (its /metrics counters; a lone
  request is a batch of 1). Both run as shipped (their defaults) with `--threads`.

Everything stays on 127.0.0.1 and stops by itself. Not a test: figures for docs/measurements.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.support.machine import environment
from benchmarks.support.manual import CHARS_PER_TOKEN, manual
from benchmarks.support.servers import daemon, daemon_pids, free_port, memory_kib, serve_process
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
    prompt_tokens: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class Workload:
    """Long-prompt chats (`--llama-server`): each client's requests, the same for both
    servers; `prompt_tokens` are cycled, each client starting at its own place."""

    prompt_tokens: tuple[int, ...]
    requests: int

    def messages(self, client: int, index: int) -> list[dict[str, str]]:
        text = manual()
        tokens = self.prompt_tokens[(client + index) % len(self.prompt_tokens)]
        chars = int(tokens * CHARS_PER_TOKEN)
        start = (client * 7919 + index * 104729) % (len(text) - chars)
        ask = "Summarise the following part of a manual in a few sentences.\n\n"
        return [{"role": "user", "content": ask + text[start : start + chars]}]


def _one(
    client: httpx.Client,
    base: str,
    max_tokens: int,
    tally: Tally,
    messages: list[dict[str, str]] | None = None,
) -> None:
    body: dict[str, Any] = {
        "messages": messages or [{"role": "user", "content": "Tell me about edge boards."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if messages is not None:  # a forced length: every request decodes max_tokens
        body["ignore_eos"] = True
    deltas = 0
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
                if event.get("choices") and event["choices"][0]["delta"].get("content"):
                    first = first or time.perf_counter()
                    deltas += 1
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
                    with tally.lock:
                        tally.prompt_tokens.append(event["usage"]["prompt_tokens"])
    except (httpx.HTTPError, RuntimeError) as exc:
        with tally.lock:
            tally.errors.append(repr(exc))
        return
    end = time.perf_counter()
    with tally.lock:
        tally.ttft_s.append((first or end) - start)
        tally.latency_s.append(end - start)
        tally.tokens += tokens or deltas


def _level(
    base: str, clients: int, seconds: float, max_tokens: int, workload: Workload | None = None
) -> dict[str, Any]:
    """N closed-loop clients for `seconds`, or each through its `workload` requests."""
    tally = Tally()
    deadline = time.monotonic() + seconds

    def loop(which: int) -> None:
        if workload is None:
            with httpx.Client(timeout=120) as client:
                while time.monotonic() < deadline:
                    _one(client, base, max_tokens, tally)
            return
        # A connection each (both servers alike): llama-server closes one after a stream,
        # and the next request on it fails ("Server disconnected without sending a response").
        for index in range(workload.requests):
            with httpx.Client(timeout=600) as client:
                _one(client, base, max_tokens, tally, workload.messages(which, index))

    threads = [threading.Thread(target=loop, args=(which,)) for which in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start

    def pct(values: list[float], q: int) -> float:
        if len(values) < 2:  # a level of one request (beside llama-server, 1 stream)
            return values[0] if values else float("nan")
        # Inclusive: between the values seen, never beyond them (few requests a level).
        return statistics.quantiles(values, n=100, method="inclusive")[q - 1]

    return {
        "clients": clients,
        "requests": len(tally.latency_s),
        "prompt_tokens_mean": statistics.mean(tally.prompt_tokens) if tally.prompt_tokens else 0,
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
        "ttft_ms": [round(t * 1000) for t in tally.ttft_s],
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


@contextlib.contextmanager
def _llama_server(
    binary: Path, gguf: Path, parallel: int, threads: int, slot_tokens: int
) -> Iterator[tuple[str, int]]:
    """llama.cpp's own server on `gguf` with `parallel` slots of `slot_tokens` each
    (continuous batching, its default), until /health answers; yields its URL and pid."""
    port = free_port()
    cmd = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["-t", str(threads), "-tb", str(threads), "--parallel", str(parallel)]
    cmd += ["-c", str(parallel * slot_tokens)]
    with serve_process(
        cmd, dict(os.environ), port, ready_path="/health", ready_timeout_s=300
    ) as server:
        yield server.base, server.proc.pid


def _beside_llama_server(args: argparse.Namespace, env: dict[str, str]) -> list[dict[str, Any]]:
    """Each level on the daemon and on llama-server, alternating; one row per level."""
    workload = Workload(tuple(int(t) for t in args.prompt_tokens.split(",")), args.requests)
    slot = max(workload.prompt_tokens) + args.max_tokens + 256  # + the chat template's
    rows = []
    with daemon(args.model_dir, {**env, "ORTSERVE_THREADS": str(args.threads)}) as (base, proc):

        def ours(clients: int) -> dict[str, Any]:
            before = _batch_counts(base)
            level = _level(base, clients, 0, args.max_tokens, workload)
            level["peak_rss_mib"] = memory_kib(daemon_pids(base, proc.pid), "VmHWM") / 1024
            after = _batch_counts(base)
            # Batches the level ran (a lone request is a batch of 1) and the requests in them.
            level["batches"] = after[0] - before[0]
            level["batched_requests"] = after[1] - before[1]
            return level

        def theirs(clients: int) -> dict[str, Any]:
            server = _llama_server(args.llama_server, args.gguf, clients, args.threads, slot)
            with server as (their_base, pid):
                level = _level(their_base, clients, 0, args.max_tokens, workload)
                level["peak_rss_mib"] = memory_kib([pid], "VmHWM") / 1024
            return level

        for order, clients in enumerate(int(c) for c in args.clients.split(",") if c):
            runs = [("ortserve", ours), ("llama_server", theirs)]
            found: dict[str, dict[str, Any]] = {}
            for name, run in runs if order % 2 == 0 else runs[::-1]:
                found[name] = run(clients)
                time.sleep(1)  # the other's threads stop spinning
            ratio = found["ortserve"]["tokens_per_s"] / max(
                found["llama_server"]["tokens_per_s"], 1e-9
            )
            rows.append({"clients": clients, **found, "tokens_per_s_ratio": ratio})
            print(json.dumps(_rounded(rows[-1])), flush=True)
    return rows


def _batch_counts(base: str) -> tuple[int, int]:
    """The daemon's batches and the requests in them so far (its /metrics counters)."""
    found = {}
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("ortserve_batches_total", "ortserve_batched_requests_total"):
            found[name] = int(float(value))
    return found["ortserve_batches_total"], found["ortserve_batched_requests_total"]


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 2)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items() if k not in ("error_samples", "ttft_ms")}
    return value


def beside_table(rows: list[dict[str, Any]]) -> str:
    """Levels of `--llama-server` records (`beside_llama_server`) as a Markdown table, with
    a model column where the rows name one (benchmarks.real_sizes adds it)."""
    named = any("model" in row for row in rows)
    lines = [
        ("| model " if named else "")
        + "| streams | new tokens/s ortserve / llama-server | TTFT p50 s | TTFT p99 s "
        "| peak RSS MiB | 503s + errors, ortserve / llama-server | ortserve's batches "
        "(requests in them) |",
        ("|---" if named else "") + "|---:|---|---|---|---|---|---|",
    ]
    for row in rows:
        a, b = row["ortserve"], row["llama_server"]
        sent = a["requests"] + a["busy_503"] + a["other_errors"]  # answered or not
        lines.append(
            (f"| {row['model']} " if named else "")
            + f"| {row['clients']} | {a['tokens_per_s']:.1f} / {b['tokens_per_s']:.1f} "
            f"({row['tokens_per_s_ratio']:.2f}\u00d7) "
            f"| {a['ttft_p50_ms'] / 1000:.1f} / {b['ttft_p50_ms'] / 1000:.1f} "
            f"| {a['ttft_p99_ms'] / 1000:.1f} / {b['ttft_p99_ms'] / 1000:.1f} "
            f"| {a['peak_rss_mib']:,.0f} / {b['peak_rss_mib']:,.0f} "
            f"| {a['busy_503']}+{a['other_errors']} of {sent} / "
            f"{b['busy_503']}+{b['other_errors']} "
            f"| {a.get('batches', '?')} ({a.get('batched_requests', '?')}) |"
        )
    return "\n".join(lines)


def _run_beside(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.gguf is None:
        parser.error("--llama-server needs --gguf")
    env = {**os.environ, "ORTSERVE_PROVIDERS": "cpu", **dict(kv.split("=", 1) for kv in args.env)}
    rows = _beside_llama_server(args, env)
    print(beside_table(rows))
    if args.json:
        record = {"environment": environment(), "daemon_env": args.env, "beside_llama_server": rows}
        args.json.write_text(json.dumps(record, indent=2))


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
    parser.add_argument("--llama-server", type=Path, help="llama.cpp's server binary")
    parser.add_argument("--gguf", type=Path, help="the GGUF the model was baked from")
    parser.add_argument("--requests", type=int, default=2, help="per client, with --llama-server")
    parser.add_argument("--prompt-tokens", default="100,2000,500,1000")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.llama_server is not None:
        _run_beside(args, parser)
        return
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
                    {
                        k: round(v, 1) if isinstance(v, float) else v
                        for k, v in level.items()
                        if k != "ttft_ms"
                    }
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

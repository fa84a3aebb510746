"""Long prompts through the edge daemon, chunk sizes of the prefill, beside llama.cpp.

Run: `python -m benchmarks.long_prompt [--reps 2] [--reps-8k N] [--lengths 1000,4000,8000]
[--chunks 64,128,256,512,16384] [--json PATH]`. It writes
benchmarks/results/long_prompt-YYYY-MM-DD.json (today's UTC date, unless `--json`) and
prints a Markdown table. Not a test: figures for docs/measurements.md and for choosing
`ORTSERVE_PREFILL_CHUNK_TOKENS`, from one run on a shared machine.

Model: `--model` (default `builtin:smollm2-135m-shape`: random weights in SmolLM2-135M's
shape, context 8,192) baked with `ortserve bake --target edge-x86_64 --model-only` under
`--work` (default .cache/bench; `benchmarks.bakes.baked`), and, for llama.cpp, the same
weights as GGUF: llama.cpp's own converter to f32 and `llama_model_quantize` to Q4_0
(`benchmarks.engine_bench.ensure_gguf`) and to Q4_K_M the same way.

Prompts: 1,000, 4,000 and 8,000 token ids (8,000 + 16 new tokens fit the 8,192 context),
drawn with a fixed seed from the tokens of the model's vocabulary that are a space and
ASCII letters and that the tokenizer encodes back to themselves alone (no special or
added token). Joined as text they tokenize back, through the daemon's own `TextCodec`,
to exactly the same ids (checked before anything runs; the API takes text only), and
every engine gets those ids. The daemon's `usage.prompt_tokens` is checked against the
length on every request.

Daemon variants: one `ortserve serve` on loopback per `ORTSERVE_PREFILL_CHUNK_TOKENS` in
`--chunks` (16384 = "whole", the prompt appended at once: the behaviour before chunked
prefill), all with `ORTSERVE_THREADS=2`, `ORTSERVE_PROVIDERS=cpu`,
`ORTSERVE_PROMPT_CACHE_SLOTS=0` and the other settings at their defaults (so
`ORTSERVE_MAX_CONCURRENCY=1` with `ORTSERVE_MAX_BATCH=4`: a batchable request that comes
during another's prefill in parts starts beside it). Each daemon is started once and warmed up
with one request on a 1,000-token prompt of another seed. One measurement = one streamed
`/v1/completions` request on the long prompt (16 new tokens, temperature 0,
batchable: no `ignore_eos`, no seed), with, meanwhile:

- TTFT: request sent -> the first SSE event that carries a choice; prefill tokens/s =
  prompt tokens / TTFT (so it includes HTTP, tokenization and the first decode step);
- `/healthz` latency, sampled by its own thread and its own httpx client (timeout 300 s)
  every 50 ms (a sample starts 50 ms after the previous one started, or at once when that
  one took longer) from the moment the long request is sent until its first token (the
  sample in flight then is waited for and kept): p50, p99, max and the sample count; a
  sample that fails (not 200, or the connection reset) is counted apart as "failed";
- a concurrent short request (32 token ids of another seed, 8 new tokens, streamed) sent
  1 s after the long one: its TTFT from its own send (when the long request's first token
  came before 1 s, the short one met only its decode, or nothing);
- peak RSS: the daemon's VmRSS when idle just before, then `echo 5 > /proc/PID/clear_refs`
  (resets VmHWM to the current RSS; the reset is checked), and VmHWM after both requests
  ended; the table gives peak - idle.

llama.cpp variants (skipped, with a message, when `llama_cpp` cannot be imported): Q4_0
and Q4_K_M, flash attention off and on, each a fresh subprocess per repetition
(`--llama-worker`): `Llama(n_ctx=8192, n_threads=n_threads_batch=2, flash_attn=...)`,
the library's default n_batch/n_ubatch, one warm-up eval of the warm-up prompt, then per
length: `reset()`, VmRSS, clear_refs, `eval(ids)` and the argmax of the last logits (the
first token): TTFT = that time, in process (no HTTP); peak - idle as for the daemon.

Order: every repetition runs each variant (all lengths) in turn, the order reversed on
odd repetitions; `--reps-8k` (default: `--reps`) caps how many repetitions measure 8,000.
The tables show medians (the /healthz percentiles pool every sample of the repetitions;
"short TTFT" is the median of the short requests that were served, and "(Nx 503)" counts
those the daemon refused as busy). The machine is shared: before each measurement the
benchmark waits (up to `--quiet-wait` s) until other processes use at most
`--max-other-load` cores, records the cores others used during it (the machine's busy
time minus this process's, its reaped workers' and the daemon's), and repeats a
disturbed measurement up to `--retries` times. It prints two tables, of every run and of
the quiet runs only (others <= `--max-other-load`), and stores both;
`--render REPORT.json` re-summarizes a saved report that way.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.bakes import baked
from benchmarks.engine_bench import ensure_gguf, llama_cpp_version, quantize_gguf
from benchmarks.machine_load import wait_quiet
from benchmarks.support.machine import cpu_model
from benchmarks.support.servers import daemon, daemon_pids, memory_kib

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = (1000, 4000, 8000)
CHUNKS = (64, 128, 256, 512, 16384)
WHOLE = 16384  # the setting's maximum: the whole prompt at once
NEW_TOKENS = 16
SHORT_LEN, SHORT_NEW, SHORT_DELAY_S = 32, 8, 1.0
HEALTH_PERIOD_S = 0.05
N_CTX = 8192
LLAMA_FTYPES = ("Q4_0", "Q4_K_M")
SEED_LONG, SEED_SHORT, SEED_WARMUP = 0, 1, 2
WARMUP_LEN = 1000
_WORD = re.compile(r"^ [A-Za-z]+$")


# -- prompts -----------------------------------------------------------------------------


def token_pool(model_dir: Path) -> list[int]:
    """Ids whose text is a space and ASCII letters, that encode back to themselves alone."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    added = set(tokenizer.get_added_tokens_decoder())
    pool = []
    for token_id in range(tokenizer.get_vocab_size(with_added_tokens=False)):
        if token_id in added:
            continue
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        if _WORD.match(text) and tokenizer.encode(text, add_special_tokens=False).ids == [token_id]:
            pool.append(token_id)
    return pool


@dataclass(frozen=True)
class Prompt:
    """Token ids and the text the daemon tokenizes back to exactly those ids."""

    ids: list[int]
    text: str


def make_prompt(model_dir: Path, pool: list[int], length: int, seed: int) -> Prompt:
    """`length` ids drawn from `pool` with `seed`, and their text (checked to round-trip
    through the daemon's tokenizer, BOS/EOS it adds included)."""
    from tokenizers import Tokenizer

    from ortserve.core.text import TextCodec

    rng = random.Random(seed)  # noqa: S311 - reproducible prompt ids, not secrets
    ids = [rng.choice(pool) for _ in range(length)]
    text = Tokenizer.from_file(str(model_dir / "tokenizer.json")).decode(ids)
    codec = TextCodec(model_dir)
    encoded = codec.encode(text)
    wrapped = [*codec.record.prefix_ids, *ids, *codec.record.suffix_ids]
    if encoded != wrapped:
        raise SystemExit(f"the {length}-token prompt does not tokenize back to its ids")
    return Prompt(wrapped, text)


# -- /proc -------------------------------------------------------------------------------


def proc_kib(pid: int | str, key: str) -> int:
    """A `/proc/PID/status` memory field (VmRSS, VmHWM) in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} for pid {pid}")


def reset_peak(pid: int | str) -> bool:
    """Reset the process's VmHWM to its current RSS; True when the reset took."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return proc_kib(pid, "VmHWM") <= proc_kib(pid, "VmRSS") + 1024


def _cpu_s(pids: list[int]) -> float:
    """Busy CPU seconds of the machine minus those of this process, its reaped children
    and `pids` (utime + stime from /proc/PID/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields)
    tick = os.sysconf("SC_CLK_TCK")
    busy = (user + nice + system + irq + softirq + steal) / tick
    own = sum(
        u.ru_utime + u.ru_stime
        for u in (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
    )
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        own += (int(stat[11]) + int(stat[12])) / tick
    return busy - own


class OtherLoad:
    """Cores that other processes used while the `with` block ran (`.cores`)."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.cores = 0.0

    def __enter__(self) -> OtherLoad:
        self._start = (_cpu_s(self.pids), time.monotonic())
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.monotonic() - self._start[1]
        self.cores = max(0.0, (_cpu_s(self.pids) - self._start[0]) / wall) if wall > 0 else 0.0


# -- the daemon --------------------------------------------------------------------------


@dataclass
class Stream:
    """One streamed completion as the client saw it."""

    sent: float = 0.0  # perf_counter when the request was sent
    ttft_s: float = float("nan")
    last_s: float = float("nan")  # from `sent` to the last event with a choice
    first_text_empty: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str = ""


def stream_completion(
    client: httpx.Client,
    base: str,
    text: str,
    new_tokens: int,
    out: Stream,
    first: threading.Event | None = None,
    ignore_eos: bool = False,
) -> None:
    """POST a streamed /v1/completions and fill `out`; set `first` at the first token."""
    # Plain greedy requests, batchable as most are (an `ignore_eos` or seeded one takes a
    # whole generation slot, and with MAX_CONCURRENCY=1 a second request waits for it).
    body = {
        "prompt": text,
        "max_tokens": new_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **({"ignore_eos": True} if ignore_eos else {}),
    }
    out.sent = time.perf_counter()
    try:
        with client.stream("POST", f"{base}/v1/completions", json=body) as response:
            if response.status_code != 200:
                out.error = f"HTTP {response.status_code}: {response.read().decode()[:300]}"
                return
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    out.error = json.dumps(event["error"])[:300]
                if event.get("choices"):
                    out.last_s = time.perf_counter() - out.sent
                if event.get("choices") and math.isnan(out.ttft_s):
                    out.ttft_s = time.perf_counter() - out.sent
                    out.first_text_empty = not event["choices"][0].get("text")
                    if first is not None:
                        first.set()
                if event.get("usage"):
                    out.prompt_tokens = event["usage"]["prompt_tokens"]
                    out.completion_tokens = event["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        if first is not None:
            first.set()


def sample_health(
    base: str, stop: threading.Event, out: list[float], period_s: float = HEALTH_PERIOD_S
) -> None:
    """GET /healthz every `period_s` until `stop`; latencies (s) into `out`, inf for
    a sample that failed (not 200, or a transport error)."""
    with httpx.Client(timeout=300) as client:
        client.get(f"{base}/healthz")  # connect before the measured request is sent
        out.append(-1.0)  # the marker: connected
        due = time.perf_counter()
        while not stop.is_set():
            start = time.perf_counter()
            try:
                ok = client.get(f"{base}/healthz").status_code == 200
            except httpx.HTTPError:  # e.g. the daemon reset the connection: a failure
                ok = False
            out.append(time.perf_counter() - start if ok else float("inf"))
            due = max(due + period_s, time.perf_counter())
            stop.wait(max(0.0, due - time.perf_counter()))


@dataclass
class DaemonRun:
    """One long request on one daemon, with the health samples and the short request."""

    chunk: int
    length: int
    rep: int
    ttft_s: float
    prompt_tokens: int
    completion_tokens: int
    health_s: list[float]
    short_ttft_s: float
    short_sent_after_first_token: bool
    idle_rss_kib: int
    peak_rss_kib: int
    peak_reset: bool
    other_load: float
    errors: list[str] = field(default_factory=list)

    @property
    def prefill_tps(self) -> float:
        """Prompt tokens per second of TTFT."""
        return self.length / self.ttft_s

    @property
    def peak_over_idle_mib(self) -> float:
        """Peak RSS during the request minus the idle RSS before it."""
        return (self.peak_rss_kib - self.idle_rss_kib) / 1024


def measure_daemon(
    base: str, pid: int, chunk: int, length: int, rep: int, long: Prompt, short: Prompt
) -> DaemonRun:
    """One long request with the health sampler and the short request beside it (memory
    and CPU: the daemon's and its engine process's together)."""
    pids = daemon_pids(base, pid)
    idle = memory_kib(pids, "VmRSS")
    reset = all([reset_peak(p) for p in pids])
    first = threading.Event()
    health: list[float] = []
    main, side = Stream(), Stream()

    def sampler() -> None:
        sample_health(base, first, health)

    def short_request() -> None:
        due = main.sent + SHORT_DELAY_S
        time.sleep(max(0.0, due - time.perf_counter()))
        with httpx.Client(timeout=600) as client:
            stream_completion(client, base, short.text, SHORT_NEW, side)

    with OtherLoad(pids) as load, httpx.Client(timeout=600) as client:
        health_thread = threading.Thread(target=sampler, daemon=True)
        health_thread.start()
        while not health and health_thread.is_alive():  # wait until it has connected
            time.sleep(0.005)
        main.sent = time.perf_counter()
        short_thread = threading.Thread(target=short_request, daemon=True)
        short_thread.start()
        stream_completion(client, base, long.text, NEW_TOKENS, main, first)
        short_thread.join()
        health_thread.join()
    peak = memory_kib(pids, "VmHWM")
    errors = [f"{name}: {s.error}" for name, s in (("long", main), ("short", side)) if s.error]
    if main.prompt_tokens != len(long.ids):
        errors.append(f"long: usage.prompt_tokens {main.prompt_tokens} != {len(long.ids)}")
    if not 1 <= main.completion_tokens <= NEW_TOKENS:
        errors.append(f"long: usage.completion_tokens {main.completion_tokens} > {NEW_TOKENS}")
    if side.prompt_tokens != len(short.ids) or not 1 <= side.completion_tokens <= SHORT_NEW:
        errors.append(f"short: usage {side.prompt_tokens}/{side.completion_tokens}")
    return DaemonRun(
        chunk=chunk,
        length=length,
        rep=rep,
        ttft_s=main.ttft_s,
        prompt_tokens=main.prompt_tokens,
        completion_tokens=main.completion_tokens,
        health_s=health[1:],
        short_ttft_s=side.ttft_s,
        short_sent_after_first_token=side.sent > main.sent + main.ttft_s,
        idle_rss_kib=idle,
        peak_rss_kib=peak,
        peak_reset=reset,
        other_load=load.cores,
        errors=errors,
    )


# -- llama.cpp ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaRun:
    """One prefill in a llama.cpp worker."""

    length: int
    ttft_s: float
    first_token: int
    idle_rss_kib: int
    peak_rss_kib: int
    peak_reset: bool


def llama_worker(
    path: Path, prompts: dict[int, list[int]], warmup: list[int], flash_attn: bool, threads: int
) -> dict[str, Any]:
    """Load the GGUF, warm up, and time each prompt's prefill and first token."""
    import llama_cpp
    import numpy as np

    start = time.perf_counter()
    # Any: llama_cpp is typed in part (Llama.reset is not), and absent without the extra.
    llm: Any = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=N_CTX,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=flash_attn,
        verbose=False,
    )
    load_s = time.perf_counter() - start
    n_vocab = int(llm.n_vocab())

    def first_token(ids: list[int]) -> int:
        llm.reset()
        llm.eval(ids)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), (n_vocab,))
        return int(logits.argmax())

    first_token(warmup)
    runs = []
    for length, ids in prompts.items():
        llm.reset()
        idle = proc_kib("self", "VmRSS")
        reset = reset_peak("self")
        start = time.perf_counter()
        token = first_token(ids)
        ttft = time.perf_counter() - start
        runs.append(LlamaRun(length, ttft, token, idle, proc_kib("self", "VmHWM"), reset))
    return {
        "load_s": load_s,
        "n_batch": llm.n_batch,
        "n_ubatch": int(llm.context_params.n_ubatch),
        "runs": [asdict(r) for r in runs],
    }


def spawn_llama(path: Path, ids_file: Path, flash_attn: bool, threads: int) -> dict[str, Any]:
    """Run `llama_worker` in a fresh interpreter and return what it measured."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.long_prompt",
        "--llama-worker",
        str(path),
        "--ids-file",
        str(ids_file),
        "--threads",
        str(threads),
    ]
    done = subprocess.run(
        command + (["--flash-attn"] if flash_attn else []),
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise SystemExit(f"llama.cpp worker failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def ensure_quantized(model: str, work: Path, threads: int, ftype: str) -> Path:
    """The GGUF of `model` quantized to `ftype` (Q4_0 by engine_bench, others from its f32)."""
    q4_0 = ensure_gguf(model, work, threads, None)  # also makes the f32 GGUF
    if ftype == "Q4_0":
        return q4_0
    f32 = q4_0.with_name(q4_0.name.replace("q4_0", "f32"))
    out = q4_0.with_name(q4_0.name.replace("q4_0", ftype.lower()))
    if out.is_file():
        return out
    return quantize_gguf(f32, out, ftype, threads)


# -- the run -----------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of `values`, NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def daemon_label(chunk: int) -> str:
    """The table's name of a daemon variant."""
    return "og whole" if chunk == WHOLE else f"og chunk {chunk}"


def llama_label(ftype: str, flash_attn: bool) -> str:
    """The table's name of a llama.cpp variant."""
    return f"llama.cpp {ftype} FA {'on' if flash_attn else 'off'}"


def summarize_daemon(runs: list[DaemonRun]) -> dict[str, Any]:
    """Medians over repetitions; health percentiles over all samples of all repetitions."""
    every = [s * 1000 for r in runs for s in r.health_s]
    health_ms = [s for s in every if math.isfinite(s)]
    return {
        "ttft_ms": _median([r.ttft_s * 1000 for r in runs]),
        "prefill_tps": _median([r.prefill_tps for r in runs]),
        "health_p50_ms": _pct(health_ms, 0.50),
        "health_p99_ms": _pct(health_ms, 0.99),
        "health_max_ms": max(health_ms, default=float("nan")),
        "health_samples": len(every),
        "health_failures": len(every) - len(health_ms),
        "short_ttft_ms": _median([r.short_ttft_s * 1000 for r in runs if r.short_ttft_s > 0]),
        "short_busy": sum(any(e.startswith("short: HTTP 503") for e in r.errors) for r in runs),
        "short_after_first_token": sum(r.short_sent_after_first_token for r in runs),
        "peak_over_idle_mib": _median([r.peak_over_idle_mib for r in runs]),
        "idle_rss_mib": _median([r.idle_rss_kib / 1024 for r in runs]),
        "other_load_max": max(r.other_load for r in runs),
        "reps": len(runs),
        "errors": [e for r in runs for e in r.errors],
    }


def summarize_llama(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repetitions of one llama.cpp variant at one length."""
    return {
        "ttft_ms": _median([r["ttft_s"] * 1000 for r in runs]),
        "prefill_tps": _median([r["length"] / r["ttft_s"] for r in runs]),
        "peak_over_idle_mib": _median(
            [(r["peak_rss_kib"] - r["idle_rss_kib"]) / 1024 for r in runs]
        ),
        "idle_rss_mib": _median([r["idle_rss_kib"] / 1024 for r in runs]),
        "other_load_max": max(r["other_load"] for r in runs),
        "reps": len(runs),
    }


def _f(value: float, digits: int = 0) -> str:
    return "-" if math.isnan(value) else f"{value:,.{digits}f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table: one row per (length, variant)."""
    lines = [
        "| prompt | variant | TTFT ms | prefill tok/s | /healthz p50 / p99 / max ms (n) "
        "| short TTFT ms | peak-idle MiB | others' cores | reps |",
        "|---:|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        s = row["summary"]
        if row["engine"] == "og":
            health = (
                f"{_f(s['health_p50_ms'], 1)} / {_f(s['health_p99_ms'], 1)} / "
                f"{_f(s['health_max_ms'], 1)} ({s['health_samples']}"
                + (f", {s['health_failures']} failed" if s.get("health_failures") else "")
                + ")"
            )
            busy = s.get("short_busy", 0)
            short = _f(s["short_ttft_ms"]) + (f" ({busy}x 503)" if busy else "")
        else:
            health, short = "-", "-"
        lines.append(
            f"| {row['length']:,} | {row['variant']} | {_f(s['ttft_ms'])} | "
            f"{_f(s['prefill_tps'])} | {health} | {short} | {_f(s['peak_over_idle_mib'])} | "
            f"{s['other_load_max']:.2f} | {s['reps']} |"
        )
    return "\n".join(lines)


def _measured(args: argparse.Namespace, what: str) -> Iterator[int]:
    """Attempts of one measurement: wait for quiet, yield the attempt number."""
    for attempt in range(args.retries + 1):
        wait_quiet(args.quiet_wait, args.max_other_load)
        yield attempt
        if attempt < args.retries:
            print(f"  {what}: disturbed; again", flush=True)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:smollm2-135m-shape")
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench", help="cache")
    parser.add_argument("--reps", type=int, default=2, help="repetitions (default 2)")
    parser.add_argument("--reps-8k", type=int, help="repetitions that measure 8,000 tokens")
    parser.add_argument("--lengths", type=_ints, default=list(LENGTHS))
    parser.add_argument("--chunks", type=_ints, default=list(CHUNKS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-llama", action="store_true", help="skip llama.cpp")
    parser.add_argument("--json", type=Path, help="default benchmarks/results/long_prompt-DATE")
    parser.add_argument("--max-other-load", type=float, default=0.2)
    parser.add_argument("--retries", type=int, default=1, help="repeats of a disturbed run")
    parser.add_argument("--quiet-wait", type=float, default=60, help="s to wait for quiet")
    parser.add_argument("--render", type=Path, help="re-summarize a saved report and print it")
    parser.add_argument("--llama-worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--ids-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--flash-attn", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


@dataclass
class Bench:
    """What a run measures on, and what it measured so far."""

    args: argparse.Namespace
    longs: dict[int, Prompt]
    short: Prompt
    warmup: Prompt
    ggufs: dict[str, Path]
    ids_file: Path
    daemon_runs: dict[int, list[DaemonRun]] = field(default_factory=dict)
    llama_runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    llama_info: dict[str, Any] = field(default_factory=dict)

    def run_daemon(self, chunk: int, base: str, pid: int, rep: int, lengths: list[int]) -> None:
        """Measure each length on one daemon (a disturbed measurement is repeated)."""
        for length in lengths:
            for _ in _measured(self.args, f"{daemon_label(chunk)} {length}"):
                run = measure_daemon(base, pid, chunk, length, rep, self.longs[length], self.short)
                if run.other_load <= self.args.max_other_load:
                    break
            self.daemon_runs.setdefault(chunk, []).append(run)
            health = max(run.health_s, default=float("nan")) * 1000
            print(
                f"rep {rep + 1} {daemon_label(chunk):<15} {length:>5}: TTFT "
                f"{run.ttft_s * 1000:7.0f} ms, /healthz max {health:6.1f} ms "
                f"({len(run.health_s)}), short TTFT {run.short_ttft_s * 1000:6.0f} ms, "
                f"peak-idle {run.peak_over_idle_mib:6.0f} MiB, others {run.other_load:.2f}"
                + (f" ERRORS {run.errors}" if run.errors else ""),
                flush=True,
            )

    def run_llama(self, ftype: str, flash: bool, rep: int) -> None:
        """One llama.cpp worker (every length; a disturbed one is repeated)."""
        label = llama_label(ftype, flash)
        for _ in _measured(self.args, label):
            with OtherLoad([]) as load:
                result = spawn_llama(self.ggufs[ftype], self.ids_file, flash, self.args.threads)
            if load.cores <= self.args.max_other_load:
                break
        self.llama_info[label] = {k: v for k, v in result.items() if k != "runs"}
        for r in result["runs"]:
            self.llama_runs.setdefault(f"{label}|{r['length']}", []).append(
                r | {"rep": rep, "other_load": load.cores}
            )
        cells = ", ".join(f"{r['length']}: {r['ttft_s'] * 1000:.0f}" for r in result["runs"])
        print(f"rep {rep + 1} {label:<26} TTFT ms {cells}, others {load.cores:.2f}", flush=True)

    def rows(self, quiet: bool = False) -> list[dict[str, Any]]:
        """Summaries per (length, variant) of every run, or of the quiet ones only."""
        return summary_rows(
            self.daemon_runs,
            self.llama_runs,
            self.args.lengths,
            self.args.chunks,
            list(self.ggufs),
            self.args.max_other_load if quiet else float("inf"),
        )


def summary_rows(
    daemon_runs: dict[int, list[DaemonRun]],
    llama_runs: dict[str, list[dict[str, Any]]],
    lengths: list[int],
    chunks: list[int],
    ftypes: list[str],
    max_other_load: float,
) -> list[dict[str, Any]]:
    """Summaries per (length, variant), in the table's order, of the runs during which
    other processes used at most `max_other_load` cores."""
    rows: list[dict[str, Any]] = []
    for length in lengths:
        for chunk in chunks:
            runs = [
                r
                for r in daemon_runs.get(chunk, [])
                if r.length == length and r.other_load <= max_other_load
            ]
            if runs:
                rows.append(
                    {
                        "engine": "og",
                        "variant": daemon_label(chunk),
                        "chunk": chunk,
                        "length": length,
                        "summary": summarize_daemon(runs),
                    }
                )
        for ftype in ftypes:
            for flash in (False, True):
                label = llama_label(ftype, flash)
                found = [
                    r
                    for r in llama_runs.get(f"{label}|{length}", [])
                    if r["other_load"] <= max_other_load
                ]
                if found:
                    rows.append(
                        {
                            "engine": "llama.cpp",
                            "variant": label,
                            "ftype": ftype,
                            "flash_attn": flash,
                            "length": length,
                            "summary": summarize_llama(found),
                        }
                    )
    return rows


def render(path: Path, max_other_load: float) -> None:
    """Print, and store in the report, both tables of a saved report (re-summarized)."""
    report = json.loads(path.read_text(encoding="utf-8"))
    proto = report["protocol"]
    daemon_runs = {
        int(c): [DaemonRun(**r) for r in runs] for c, runs in report["runs"]["og"].items()
    }
    args = (report["runs"]["llama.cpp"], proto["lengths"], proto["chunks"], list(proto["ggufs"]))
    report["rows"] = summary_rows(daemon_runs, *args, float("inf"))
    report["table"] = markdown(report["rows"])
    report["rows_quiet"] = summary_rows(daemon_runs, *args, max_other_load)
    report["table_quiet"] = markdown(report["rows_quiet"])
    print(
        f"every run:\n{report['table']}\n\nothers <= {max_other_load} cores:\n"
        f"{report['table_quiet']}"
    )
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


def _worker_main(args: argparse.Namespace) -> None:
    data = json.loads(args.ids_file.read_text())
    prompts = {int(k): v for k, v in data["prompts"].items()}
    result = llama_worker(args.llama_worker, prompts, data["warmup"], args.flash_attn, args.threads)
    print(json.dumps(result))


def _run(bench: Bench, model_dir: Path, env: dict[str, str], reps_8k: int) -> None:
    """Start the daemons, warm them up, and run the alternating repetitions."""
    args = bench.args
    variants: list[tuple[str, Any]] = [("og", c) for c in args.chunks]
    variants += [("llama", (t, fa)) for t in bench.ggufs for fa in (False, True)]
    with ExitStack() as stack:
        servers: dict[int, tuple[str, int]] = {}
        for chunk in args.chunks:
            chunk_env = {**env, "ORTSERVE_PREFILL_CHUNK_TOKENS": str(chunk)}
            base, proc = stack.enter_context(daemon(model_dir, chunk_env))
            servers[chunk] = (base, proc.pid)
            warm = Stream()
            with httpx.Client(timeout=600) as client:
                stream_completion(client, base, bench.warmup.text, NEW_TOKENS, warm)
            if warm.error or warm.prompt_tokens != len(bench.warmup.ids):
                raise SystemExit(f"warm-up on chunk {chunk}: {warm.error or warm.prompt_tokens}")
        print(f"{len(servers)} daemons ready", flush=True)
        for rep in range(args.reps):
            lengths = [n for n in args.lengths if n != max(LENGTHS) or rep < reps_8k]
            prompts = {n: bench.longs[n].ids for n in lengths}
            bench.ids_file.write_text(json.dumps({"prompts": prompts, "warmup": bench.warmup.ids}))
            for engine, key in variants if rep % 2 == 0 else variants[::-1]:
                if engine == "og":
                    bench.run_daemon(key, *servers[key], rep, lengths)
                else:
                    ftype, flash = key
                    bench.run_llama(ftype, flash, rep)


def main(argv: list[str] | None = None) -> None:
    """Bake, prepare prompts and GGUFs, run the alternating repetitions, print and save."""
    args = _parse_args(argv)
    if args.llama_worker:
        _worker_main(args)
        return
    if args.render:
        render(args.render, args.max_other_load)
        return
    began = time.monotonic()
    model_dir = baked(args.work, args.model, "edge-x86_64", package=False) / "model"
    pool = token_pool(model_dir)
    print(f"{len(pool)} word tokens to draw prompts from", flush=True)
    llama_version = None if args.no_llama else llama_cpp_version()
    ggufs: dict[str, Path] = {}
    if llama_version is not None:
        ggufs = {t: ensure_quantized(args.model, args.work, args.threads, t) for t in LLAMA_FTYPES}
    reps_8k = args.reps if args.reps_8k is None else args.reps_8k
    env = {
        **os.environ,
        "ORTSERVE_THREADS": str(args.threads),
        "ORTSERVE_PROVIDERS": "cpu",
        "ORTSERVE_PROMPT_CACHE_SLOTS": "0",
    }
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(
            args=args,
            longs={n: make_prompt(model_dir, pool, n, SEED_LONG) for n in args.lengths},
            short=make_prompt(model_dir, pool, SHORT_LEN, SEED_SHORT),
            warmup=make_prompt(model_dir, pool, WARMUP_LEN, SEED_WARMUP),
            ggufs=ggufs,
            ids_file=Path(tmp) / "ids.json",
        )
        _run(bench, model_dir, env, reps_8k)
    wall_s = time.monotonic() - began
    rows, rows_quiet = bench.rows(), bench.rows(quiet=True)
    table, table_quiet = markdown(rows), markdown(rows_quiet)
    print(
        f"\n{args.model}, {args.threads} threads, {NEW_TOKENS} new tokens, medians of "
        f"{args.reps} repetitions (8,000: {reps_8k}); wall {wall_s / 60:.1f} min\n"
    )
    print(table)
    print(f"\nonly the runs during which others used <= {args.max_other_load} cores:\n")
    print(table_quiet)
    errors = [e for row in rows if row["engine"] == "og" for e in row["summary"]["errors"]]
    if errors:
        print("\ndaemon errors:\n" + "\n".join(errors))
    protocol = {
        "lengths": args.lengths,
        "chunks": args.chunks,
        "whole": WHOLE,
        "reps": args.reps,
        "reps_8k": reps_8k,
        "threads": args.threads,
        "new_tokens": NEW_TOKENS,
        "short_prompt": SHORT_LEN,
        "short_new": SHORT_NEW,
        "short_delay_s": SHORT_DELAY_S,
        "health_period_s": HEALTH_PERIOD_S,
        "n_ctx_llama": N_CTX,
        "daemon_env": {k: v for k, v in env.items() if k.startswith("ORTSERVE_")},
        "seeds": {"long": SEED_LONG, "short": SEED_SHORT, "warmup": SEED_WARMUP},
        "word_tokens": len(pool),
        "max_other_load": args.max_other_load,
        "ggufs": {t: str(p) for t, p in ggufs.items()},
        "llama": bench.llama_info,
    }
    report = {
        "model": args.model,
        "model_dir": str(model_dir),
        "protocol": protocol,
        "environment": {
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "llama_cpp": llama_version or "absent",
            "wall_s": round(wall_s, 1),
        },
        "rows": rows,
        "table": table,
        "rows_quiet": rows_quiet,
        "table_quiet": table_quiet,
        "runs": {
            "og": {str(c): [asdict(r) for r in runs] for c, runs in bench.daemon_runs.items()},
            "llama.cpp": bench.llama_runs,
        },
    }
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    out = args.json or ROOT / "benchmarks" / "results" / f"long_prompt-{today}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()

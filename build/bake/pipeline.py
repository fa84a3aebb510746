"""The bake pipeline: source → ONNX GenAI folder (+ manifest) → smoke generation → atomic rename."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bake.errors import BakeError, say
from bake.genai_config import infer_genai_config, set_session_options
from bake.package import MODEL_SUBDIR, package
from bake.sources import PROCESSING_FILES, ResolvedSource, resolve
from bake.targets import DEFAULT_MAX_PPL_RATIO, Target, builder_options, get_target
from core.manifest import Manifest, QualityCheck, list_files, write_manifest

if TYPE_CHECKING:
    from core.engine import Engine

# Head sizes the CPU GroupQueryAttention kernel accepts.
_HEAD_SIZE_MULTIPLE = 16
_ONNX_SUFFIXES = (".onnx", ".onnx.data", ".onnx_data")
_ONNX_EXTRA_FILES = ("genai_config.json", *PROCESSING_FILES)


@dataclass
class BakeRequest:
    """Everything `ortserve bake` was asked to do."""

    source: str
    target: str
    out: Path | None = None
    precision: str = "int4"
    revision: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    force: bool = False
    smoke: bool = True
    package: bool = True
    quality_check: bool = True
    max_ppl_ratio: float = DEFAULT_MAX_PPL_RATIO
    cache_dir: Path | None = None  # PyPI downloads and GGUF conversions (None: this bake only)


@dataclass
class BakeResult:
    """What a bake produced: `folder` is the bundle; the model is in `folder/model`."""

    folder: Path
    manifest: Manifest
    smoke_text: str
    smoke_provider: str


def default_out(source: str, target: str) -> Path:
    """models/<source-slug>-<target>: where a bake writes when --out is not given."""
    slug = source
    for prefix in ("builtin:", "s3://", "pypi:"):
        slug = slug.removeprefix(prefix)
    slug = slug.rstrip("/").replace("/", "--").replace("==", "-")
    name = Path(slug).name.removesuffix(".gguf")
    return Path("models") / f"{name}-{target}"


def _check_block_size(config: dict[str, object], options: dict[str, str]) -> None:
    """k_quant needs blocks that divide every weight row; say so before the builder fails
    with a numpy reshape error."""
    if not options.get("algo_config", "").startswith("k_quant"):
        return
    block = int(options.get("block_size", "32"))
    for name in ("hidden_size", "intermediate_size"):
        width = config.get(name)
        if isinstance(width, int) and width % block:
            raise BakeError(
                f"block_size {block} does not divide the model's {name} {width}, which "
                f"algo_config={options['algo_config']} needs: choose a block size that "
                "divides it (e.g. 32), or --builder-option algo_config=rtn"
            )


def _check_checkpoint(folder: Path, target: Target, options: dict[str, str]) -> None:
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    heads = config.get("num_attention_heads")
    hidden = config.get("hidden_size")
    head_size = config.get("head_dim") or (hidden // heads if heads and hidden else None)
    if target.builder_ep == "cpu" and head_size and head_size % _HEAD_SIZE_MULTIPLE:
        raise BakeError(
            f"head size {head_size} is not a multiple of {_HEAD_SIZE_MULTIPLE}: the CPU "
            "GroupQueryAttention kernel rejects it"
        )
    _check_block_size(config, options)


def _last_error_line(log: str) -> str:
    for line in reversed(log.strip().splitlines()):
        stripped = line.strip()
        head = stripped.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return stripped
    tail = log.strip().splitlines()
    return tail[-1].strip() if tail else "no output"


def _run_builder(
    src: Path, out: Path, cache: Path, precision: str, target: Target, options: dict[str, str]
) -> None:
    cmd = [
        sys.executable, "-m", "onnxruntime_genai.models.builder",
        "-i", str(src), "-o", str(out), "-p", precision, "-e", target.builder_ep,
        "-c", str(cache),
    ]  # fmt: skip
    if options:
        cmd += ["--extra_options", *(f"{k}={v}" for k, v in options.items())]
    say(f"converting with the onnxruntime-genai builder: {precision}, -e {target.builder_ep}, "
         f"{' '.join(f'{k}={v}' for k, v in options.items()) or 'default options'}")  # fmt: skip
    cache.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1")  # the builder reads the local folder only
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    log = proc.stdout + proc.stderr
    # The builder removes its cache folder when done: keep the log beside it.
    (cache.parent / "builder.log").write_text(log, encoding="utf-8")
    if proc.returncode != 0:
        if "No space left on device" in log:
            raise OSError(errno.ENOSPC, "No space left on device", str(out))
        raise BakeError(f"the model builder failed: {_last_error_line(log)}")


def _copy_onnx(src: Path, dst: Path) -> list[str]:
    dst.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_file() and (
            path.name.endswith(_ONNX_SUFFIXES) or path.name in _ONNX_EXTRA_FILES
        ):
            shutil.copy2(path, dst / path.name)
    if (dst / "genai_config.json").is_file():
        return []
    config, inferred = infer_genai_config(src)
    (dst / "genai_config.json").write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    for line in inferred:
        say(f"inferred: {line}")
    return inferred


def _load(folder: Path, target: Target) -> Engine:
    """Load the baked folder as the runtime will: a folder that cannot load is never installed."""
    from core.engine import Engine
    from core.errors import OrtServeError, ProviderUnavailableError
    from core.settings import EngineSettings

    providers = "cpu" if target.runtime_ep == "cpu" else f"{target.runtime_ep},cpu"
    try:
        return Engine.load(EngineSettings(model_dir=folder, providers=providers))
    except ProviderUnavailableError as exc:
        # Name onnxruntime's own reason (e.g. an invalid graph), not just "no provider".
        reason = exc.skipped.get(target.runtime_ep) or exc.skipped.get("cpu") or exc.message
        raise BakeError(
            f"the baked model does not load on {target.runtime_ep}: "
            f"{reason.removeprefix('failed to initialise: ')}"
        ) from exc
    except OrtServeError as exc:
        raise BakeError(f"the baked model does not load: {exc.message}") from exc


def _smoke(engine: Engine) -> str:
    """Generate a few tokens from the loaded baked folder; a bake that cannot generate fails."""
    from core.errors import OrtServeError
    from core.generation import GenerationRequest, SamplingOptions

    try:
        request = GenerationRequest(prompt="Hello", options=SamplingOptions(max_new_tokens=8))
        return engine.generate(request).text
    except OrtServeError as exc:
        raise BakeError(f"smoke generation on the baked model failed: {exc.message}") from exc


def _quality(source: ResolvedSource, engine: Engine, request: BakeRequest) -> QualityCheck:
    if not request.quality_check:
        say("quality gate: skipped (--no-quality-check)")
        return QualityCheck(status="skipped: --no-quality-check")
    if source.folder_kind != "hf":
        say("quality gate: skipped (an ONNX source has no checkpoint to compare with)")
        return QualityCheck(status="skipped: no source checkpoint (ONNX source)")
    from bake.quality import check

    return check(source.folder, engine, request.max_ppl_ratio, source.random_weights)


def _install(staging: Path, out: Path, force: bool) -> None:
    if out.exists():
        if not force:
            raise BakeError(f"{out} already exists (use --force to replace it)")
        trash = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(trash)
        staging.rename(out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        staging.rename(out)


def _verify(
    staging: Path, source: ResolvedSource, target: Target, request: BakeRequest, manifest: Manifest
) -> tuple[Manifest, str, str]:
    """Load the baked folder, run the quality gate and the smoke generation.

    Returns:
        The manifest with the gate's figures, the smoke text, the provider that loaded it.
    """
    engine = _load(staging, target)
    # The manifest does not list itself: adding the gate's figures changes no hash.
    manifest = manifest.model_copy(update={"quality": _quality(source, engine, request)})
    write_manifest(staging, manifest)
    text = ""
    if request.smoke:
        text = _smoke(engine)
        say(f"smoke generation on {engine.probe.provider}: {text!r}")
    return manifest, text, engine.probe.provider


def bake(request: BakeRequest) -> BakeResult:
    """Run a whole bake; on any failure nothing is left at the output path.

    Raises:
        BakeError: With a one-line reason.
    """
    target = get_target(request.target)
    options = builder_options(target, request.precision, request.options)
    if request.precision in ("fp16",) and target.builder_ep == "cpu":
        raise BakeError(f"precision fp16 is not supported on the CPU target {target.name}")
    out = (request.out or default_out(request.source, target.name)).resolve()
    if out.exists() and not request.force:
        raise BakeError(f"{out} already exists (use --force to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        bundle = work / "bundle"
        staging = bundle / MODEL_SUBDIR
        source = resolve(request.source, work / "src", request.revision, request.cache_dir)
        say(f"source: {source.name} ({source.kind}, {source.folder_kind})")
        inferred: list[str] = []
        if source.folder_kind == "hf":
            _check_checkpoint(source.folder, target, options)
            _run_builder(source.folder, staging, work / "cache", request.precision, target, options)
            precision = request.precision
        else:
            inferred = _copy_onnx(source.folder, staging)
            precision = "as exported"
            options = {}
        set_session_options(staging / "genai_config.json", target.intra_op_num_threads)
        manifest = _manifest(source, target, precision, options, inferred, staging)
        write_manifest(staging, manifest)
        manifest, text, provider = _verify(staging, source, target, request, manifest)
        if request.package:
            package(target, bundle)
        _install(bundle, out, request.force)
    except BakeError:
        raise
    except Exception as exc:
        # Disk full surfaces as OSError, or as a library's own error (safetensors'
        # SafetensorError says "os error 28"): translate every form here, once.
        if _is_disk_full(exc):
            raise BakeError(f"disk full while baking into {out.parent}") from exc
        if isinstance(exc, OSError):
            raise BakeError(f"bake failed: {exc}") from exc
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"baked {manifest.model_name} for {target.name} into {out} (model: {out / MODEL_SUBDIR})")
    return BakeResult(out, manifest, text, provider)


def _is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    text = str(exc)
    return "No space left on device" in text or "os error 28" in text


def _manifest(
    source: ResolvedSource,
    target: Target,
    precision: str,
    options: dict[str, str],
    inferred: list[str],
    folder: Path,
) -> Manifest:
    from importlib.metadata import version

    og_version = version("onnxruntime-genai")
    return Manifest(
        model_name=source.name,
        random_weights=source.random_weights,
        source=str(source.folder) if source.kind in ("local-hf", "onnx") else source.spec,
        source_kind=source.kind,
        revision=source.revision,
        precision=precision,
        target=target.name,
        execution_provider=target.runtime_ep,
        builder_options=options,
        onnxruntime_genai_version=og_version,
        builder_version=f"onnxruntime_genai.models.builder {og_version}",
        inferred=inferred,
        files=list_files(folder),
    )  # fmt: skip

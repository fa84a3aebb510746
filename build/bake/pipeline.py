"""The bake pipeline: source → ONNX GenAI folder (+ manifest) → smoke generation → atomic rename."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortserve.bake.errors import BakeError, heartbeat, run_step, say
from ortserve.bake.genai_config import add_draft, infer_genai_config, set_session_options
from ortserve.bake.lora import AdapterSpec
from ortserve.bake.onnx_source import (
    BAKED_GRAPH,
    copy_graph,
    data_files,
    graph_precision,
    load_graph,
)
from ortserve.bake.package import package
from ortserve.bake.packaging_common import MODEL_SUBDIR
from ortserve.bake.progress import BuilderProgress
from ortserve.bake.recipes import RECIPES, Recipe, default_recipe, load_recipe, target_options
from ortserve.bake.settings import builder_environment
from ortserve.bake.source_files import PROCESSING_FILES
from ortserve.bake.sources import OnnxChoice, ResolvedSource, resolve
from ortserve.bake.targets import DEFAULT_MAX_PPL_RATIO, Target, builder_options, get_target
from ortserve.bake.text import record_text, recorded_sampling
from ortserve.bake.upstream import BUILDER_MODULE, FP32_FROM, builder_input
from ortserve.core.manifest import (
    Adapter,
    GgufImport,
    Manifest,
    QualityCheck,
    list_files,
    write_manifest,
)
from ortserve.core.settings import disable_telemetry

if TYPE_CHECKING:
    from ortserve.core.engine import Engine

# Head sizes the CPU GroupQueryAttention kernel accepts.
_HEAD_SIZE_MULTIPLE = 16
_ONNX_SUFFIXES = (".onnx", ".onnx.data", ".onnx_data")
_ONNX_EXTRA_FILES = ("genai_config.json", *PROCESSING_FILES)
# What an fp32 ONNX graph can be quantized with (onnxruntime's MatMulNBitsQuantizer).
_ONNX_QUANT_BITS = {"int4": 4, "int8": 8}
_ONNX_QUANT_OPTIONS = ("block_size", "accuracy_level")


@dataclass
class BakeRequest:
    """Everything `ortserve bake` was asked to do."""

    source: str
    target: str
    out: Path | None = None
    # None: int4 for a checkpoint; an ONNX graph as exported.
    precision: str | None = None
    revision: str | None = None
    onnx_file: str | None = None  # the graph of an ONNX source, relative to it
    options: dict[str, str] = field(default_factory=dict)
    force: bool = False
    smoke: bool = True
    package: bool = True
    quality_check: bool = True
    max_ppl_ratio: float = DEFAULT_MAX_PPL_RATIO
    cache_dir: Path | None = None  # PyPI downloads and GGUF conversions (None: this bake only)
    recipe: str | None = None  # a recipe's name or file (None: the target's, for int4)
    # A GGUF source's quantized weights go into the int4 graph as they are, unless this
    # asks for the builder's quantization of their fp32 dequantization instead.
    requantize: bool = False
    # The exact import's 8-bit forms (Q5_x, Q6_K, Q8_0) made 4-bit (gguf_blocks.compact).
    compact: bool = False
    # How --compact weighs each value's error: "weights" (by the values, llama.cpp's
    # weights without an imatrix) or "activations" (an importance matrix from the
    # checkpoint run over calibration text: bake.importance).
    compact_importance: str = "weights"
    # "int8": keys and values cached as int8 with calibrated scales (bake.kv_cache).
    kv_cache: str = "fp32"
    # The logits of every position kept (prune_lm_head=false): what og 0.18's speculative
    # decoding verifies drafts with (core.engine's speculation).
    speculative: bool = False
    # A smaller model of the same vocabulary, baked beside this one (in `draft/`) to draft
    # for it (og 0.18's draft-model speculative decoding); implies `speculative`.
    draft: str | None = None
    # LoRA adapters (`NAME=PATH`, PEFT folders) served beside the model as MODEL:NAME.
    adapters: list[str] = field(default_factory=list)
    context_length: int | None = None  # tokens served (None: bake.context's default)


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


def _check_checkpoint(folder: Path, target: Target, options: dict[str, str]) -> dict[str, Any]:
    """Refuse what the builder would fail on obscurely; return the checkpoint's config."""
    config: dict[str, Any] = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    heads = config.get("num_attention_heads")
    hidden = config.get("hidden_size")
    head_size = config.get("head_dim") or (hidden // heads if heads and hidden else None)
    if target.builder_ep == "cpu" and head_size and head_size % _HEAD_SIZE_MULTIPLE:
        raise BakeError(
            f"head size {head_size} is not a multiple of {_HEAD_SIZE_MULTIPLE}: the CPU "
            "GroupQueryAttention kernel rejects it"
        )
    _check_block_size(config, options)
    return config


def _last_error_line(log: str) -> str:
    for line in reversed(log.strip().splitlines()):
        stripped = line.strip()
        head = stripped.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return stripped
    tail = log.strip().splitlines()
    return tail[-1].strip() if tail else "no output"


def _run_builder(
    src: Path,
    out: Path,
    cache: Path,
    precision: str,
    target: Target,
    options: dict[str, str],
    failed_log: Path,
    target_opts: dict[str, Any] | None = None,
    *,
    layers: int | None = None,
    vectors_from: Path | None = None,
) -> None:
    """Run the builder (with `--target_options` where a recipe has rules), its progress
    shown as it goes (`layers`: the checkpoint's decoder layers, for the count); when it
    fails, its whole log is kept at `failed_log` (outside the bake's temporary folder,
    which goes) and the error says where."""
    cmd = [
        sys.executable,
        "-m",
        BUILDER_MODULE,
        "-i",
        str(src),
        "-o",
        str(out),
        "-p",
        precision,
        "-e",
        target.builder_ep,
        "-c",
        str(cache),
    ]
    if options:
        cmd += ["--extra_options", *(f"{k}={v}" for k, v in options.items())]
    if target_opts:
        cmd += ["--target_options", json.dumps(target_opts)]
    if vectors_from is not None:  # a bf16 input's norms and biases, in fp32
        cmd += [FP32_FROM, str(vectors_from)]
    say(
        f"converting with the onnxruntime-genai builder: {precision}, -e {target.builder_ep}, "
        f"{' '.join(f'{k}={v}' for k, v in options.items()) or 'default options'}"
    )
    cache.mkdir(parents=True, exist_ok=True)
    env = builder_environment()
    started = time.monotonic()
    progress = BuilderProgress(layers)
    proc = run_step(cmd, "the model builder", env=env, progress=progress)
    say(f"the model builder finished in {time.monotonic() - started:.0f} s")
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        if "No space left on device" in log:
            raise OSError(errno.ENOSPC, "No space left on device", str(out))
        kept = ""
        try:
            failed_log.write_text(log, encoding="utf-8")
            kept = f" (the builder's whole log: {failed_log})"
        except OSError:
            pass  # the error line still says what failed
        raise BakeError(f"the model builder failed: {_last_error_line(log)}{kept}")


@dataclass(frozen=True)
class _OnnxPlan:
    """What the bake does with an ONNX source's graph: copy it, or quantize it from fp32."""

    precision: str  # for the manifest
    bits: int | None = None
    block_size: int = 0
    accuracy_level: int | None = None


def _int_option(options: dict[str, str], name: str) -> int | None:
    if name not in options:
        return None
    try:
        return int(options[name])
    except ValueError:
        raise BakeError(f"{name} must be an integer, got {options[name]!r}") from None


def _onnx_plan(request: BakeRequest, target: Target, graph: str, exported: str) -> _OnnxPlan:
    """Refuse what cannot apply to an ONNX graph; plan a quantization where one is asked."""
    builder_only = sorted(set(request.options) - set(_ONNX_QUANT_OPTIONS))
    if builder_only:
        raise BakeError(
            f"--builder-option {builder_only[0]} applies to checkpoints: the model builder "
            "does not run on an ONNX source"
        )
    if request.precision is None:
        if request.options:
            raise BakeError(
                "--block-size/--accuracy-level on an ONNX source need --precision int4 or "
                f"int8 (to quantize an fp32 graph); {graph} is used as exported ({exported})"
            )
        return _OnnxPlan(f"{exported} (as exported)")
    if exported != "fp32":
        raise BakeError(
            f"--precision {request.precision}: {graph} is already {exported}; only an fp32 "
            "ONNX graph is quantized (drop --precision, or choose another graph with --onnx-file)"
        )
    if request.precision == "fp32":
        if request.options:
            raise BakeError("--block-size/--accuracy-level need --precision int4 or int8")
        return _OnnxPlan("fp32 (as exported)")
    bits = _ONNX_QUANT_BITS.get(request.precision)
    if bits is None:
        raise BakeError(
            f"--precision {request.precision} on an ONNX source is not supported: choose a "
            f"{request.precision} graph with --onnx-file, or bake the checkpoint"
        )
    options = builder_options(target, request.precision, request.options)
    block = _int_option(options, "block_size") or 32
    level = _int_option(options, "accuracy_level")
    if block < 16 or block & (block - 1):
        raise BakeError(f"block_size must be a power of two of at least 16, got {block}")
    if level is not None and not 0 <= level <= 4:
        raise BakeError(f"accuracy_level must be 0..4, got {level}")
    return _OnnxPlan(request.precision, bits, block, level)


def _copy_onnx(
    source: ResolvedSource, dst: Path, request: BakeRequest, target: Target
) -> tuple[list[str], _OnnxPlan]:
    """Copy (or quantize) the chosen graph and the small files; infer genai_config if missing."""
    from ortserve.bake.onnx_source import quantize_graph

    assert source.graph is not None  # resolve() chooses the graph of every ONNX source
    src, graph = source.folder, source.graph.path
    say(f"ONNX variant: {graph} ({source.graph.reason})")
    model = load_graph(src / graph)
    plan = _onnx_plan(request, target, graph, graph_precision(model))
    own_config = (src / "genai_config.json").is_file()
    name = Path(graph).name if own_config else BAKED_GRAPH
    dst.mkdir(parents=True, exist_ok=True)
    skip = {graph, *data_files(model)}
    for path in src.iterdir():
        keep = path.name in _ONNX_EXTRA_FILES or (own_config and path.name.endswith(_ONNX_SUFFIXES))
        if path.is_file() and keep and path.name not in skip:
            shutil.copy2(path, dst / path.name)
    if plan.bits is None:
        copy_graph(src / graph, dst, name)
    else:
        say(
            f"quantizing {graph} to {plan.precision} with onnxruntime's MatMulNBitsQuantizer: "
            f"block_size={plan.block_size}, accuracy_level={plan.accuracy_level}"
        )
        count = quantize_graph(
            src / graph, dst, name, plan.bits, plan.block_size, plan.accuracy_level
        )
        say(f"quantized {count} MatMul weights")
    if own_config:
        return [], plan
    config, inferred = infer_genai_config(src, graph, name)
    (dst / "genai_config.json").write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    for line in inferred:
        say(f"inferred: {line}")
    return inferred, plan


def _load(folder: Path, target: Target) -> Engine:
    """Load the baked folder as the runtime will: a folder that cannot load is never installed."""
    from ortserve.core.engine import Engine
    from ortserve.core.errors import OrtServeError, ProviderUnavailableError
    from ortserve.core.settings import EngineSettings

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


_SMOKE_PROMPT = "Hello"
_SMOKE_TOKENS = 8


def _smoke(engine: Engine) -> str:
    """Generate a few tokens from the loaded baked folder, through the service requests
    take, and say what came out; a bake that cannot generate fails."""
    from ortserve.core.errors import OrtServeError
    from ortserve.core.generation import GenerationRequest, SamplingOptions
    from ortserve.core.service import Service

    options = SamplingOptions(max_new_tokens=_SMOKE_TOKENS)
    try:
        done = Service(engine, engine.settings).generate(
            GenerationRequest(prompt=_SMOKE_PROMPT, options=options)
        )
    except OrtServeError as exc:
        raise BakeError(f"smoke generation on the baked model failed: {exc.message}") from exc
    # A raw continuation of a one-word prompt, cut after a few tokens: it reads oddly even
    # from a good model, so the line says what it is.
    say(
        f"smoke test on {engine.probe.provider}: {done.completion_tokens} tokens generated "
        f"from {_SMOKE_PROMPT!r} (raw text, not a chat reply): {done.text!r}"
    )
    return done.text


def _gate_reference(source: ResolvedSource, adapter: str | None = None) -> str:
    with_adapter = "" if adapter is None else f" + the PEFT adapter {adapter}"
    if source.gguf is None:
        return f"transformers fp32 of the source checkpoint{with_adapter}"
    return f"transformers fp32 of {source.gguf.name} (its weights dequantized){with_adapter}"


def _reference_first(
    source: ResolvedSource, staging: Path, request: BakeRequest, adapter: Path | None = None
) -> tuple[list[int], Any] | None:
    """The quality gate's reference logits (with a PEFT `adapter` on the checkpoint, for
    that adapter's gate), before the baked model loads (bake.quality.reference); None
    where the gate does not run."""
    if not request.quality_check or source.folder_kind != "hf":
        return None
    from ortserve.bake.quality import reference

    config = json.loads((staging / "genai_config.json").read_text(encoding="utf-8"))
    context = int(config["model"].get("context_length") or 0)
    described = _gate_reference(source, None if adapter is None else str(adapter))
    return reference(source.folder, context, described, adapter)


def _quality(
    source: ResolvedSource,
    engine: Engine,
    request: BakeRequest,
    scored: tuple[list[int], Any] | None,
    adapter: str | None = None,
    adapter_source: str | None = None,
) -> QualityCheck:
    if not request.quality_check:
        say("quality gate: skipped (--no-quality-check)")
        return QualityCheck(status="skipped: --no-quality-check")
    if source.folder_kind != "hf" or scored is None:
        say("quality gate: skipped (an ONNX source has no checkpoint to compare with)")
        return QualityCheck(status="skipped: no source checkpoint (ONNX source)")
    from ortserve.bake.quality import check

    return check(
        scored,
        engine,
        request.max_ppl_ratio,
        source.random_weights,
        _gate_reference(source, adapter_source),
        adapter,
    )


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
    staging: Path,
    source: ResolvedSource,
    target: Target,
    request: BakeRequest,
    manifest: Manifest,
    adapters: list[AdapterSpec],
) -> tuple[Manifest, str, str]:
    """Load the baked folder, run the quality gate (the model's, each adapter's) and the
    smoke generation.

    Returns:
        The manifest with the gate's figures, the smoke text, the provider that loaded it.
    """
    scored = _reference_first(source, staging, request)
    adapter_scores = [_reference_first(source, staging, request, a.path) for a in adapters]
    engine = _load(staging, target)
    # The manifest does not list itself: adding the gate's figures changes no hash.
    quality = _quality(source, engine, request, scored)
    baked = [
        a.model_copy(update={"quality": _quality(source, engine, request, s, a.name, a.source)})
        for a, s in zip(manifest.adapters, adapter_scores, strict=True)
    ]
    manifest = manifest.model_copy(update={"quality": quality, "adapters": baked})
    write_manifest(staging, manifest)
    text = ""
    if request.smoke:
        text = _smoke(engine)
    return manifest, text, engine.probe.provider


def _convert(
    source: ResolvedSource,
    staging: Path,
    cache: Path,
    request: BakeRequest,
    target: Target,
    precision: str,
    options: dict[str, str],
    failed_log: Path,
    recipe: tuple[str, Recipe] | None,
    exact: bool = False,
) -> tuple[str, dict[str, str], str, list[str]]:
    """Build (checkpoint) or copy/quantize (ONNX) the model into `staging` (a failed
    builder's log is kept at `failed_log`), with the recipe (its manifest label and
    itself) where one applies; `exact`: a GGUF's exact import follows.

    Returns:
        The precision, options and tool for the manifest, and what was inferred.
    """
    if source.folder_kind == "hf":
        if request.onnx_file is not None:
            raise BakeError(
                f"--onnx-file applies to ONNX sources; {source.name} is a checkpoint "
                "with no ONNX graph"
            )
        config = _check_checkpoint(source.folder, target, options)
        # The exact import replaces the builder's matrices: it builds from a bf16 copy of
        # them (half the builder's memory), its vectors (norms, biases) still fp32.
        bf16 = exact and config.get("dtype", config.get("torch_dtype")) in (None, "float32")
        folder, options = builder_input(
            source.folder, cache.parent / "builder-input", options, bf16
        )
        target_opts = None
        if recipe is not None:
            recipe, target_opts = _expand(recipe, request.recipe is not None, config, options)
        layers = config.get("text_config", config).get("num_hidden_layers")  # Gemma 3 nests
        _run_builder(
            folder,
            staging,
            cache,
            precision,
            target,
            options,
            failed_log,
            target_opts,
            layers=layers if isinstance(layers, int) else None,
            vectors_from=source.folder if bf16 else None,
        )
        if recipe is not None:
            options = {**options, "recipe": recipe[0]}
        return precision, options, "onnxruntime_genai.models.builder {og} (bake.upstream)", []
    if request.recipe is not None:
        raise BakeError(
            f"--recipe applies to checkpoints (the model builder's quantization); {source.name} "
            "is an ONNX graph"
        )
    inferred, plan = _copy_onnx(source, staging, request, target)
    if plan.bits is None:
        return plan.precision, {}, "none: the ONNX graph was copied as exported", inferred
    options = {"block_size": str(plan.block_size)}
    if plan.accuracy_level is not None:
        options["accuracy_level"] = str(plan.accuracy_level)
    tool = "onnxruntime.quantization MatMulNBitsQuantizer {ort}"
    return plan.precision, options, tool, inferred


def bake(request: BakeRequest) -> BakeResult:
    """Run a whole bake; on any failure nothing is left at the output path.

    Raises:
        BakeError: With a one-line reason.
    """
    # Before a source is fetched (huggingface_hub) or quantized in this process
    # (onnxruntime), for a bake run from Python as from the CLI (core.settings).
    disable_telemetry()
    target, precision, recipe, options, out = _plan(request)
    adapters = _adapter_specs(request)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    steps = _StepTimes()
    try:
        bundle = work / "bundle"
        staging = bundle / MODEL_SUBDIR
        choice = OnnxChoice(request.onnx_file, target.runtime_ep)
        source = resolve(request.source, work / "src", request.revision, request.cache_dir, choice)
        say(f"source: {source.name} ({source.kind}, {source.folder_kind})")
        steps.done("source")
        # The one branch between the two kinds of model: the staging, install, manifest
        # and packaging around it are the same.
        if source.folder_kind == "embedding":
            from ortserve.bake.embedding import bake_embedding

            manifest, text = bake_embedding(source, staging, request, target, work)
            provider = "cpu"
            steps.done("export and gate")
        else:
            manifest, text, provider = _bake_generative(
                request, source, target, (precision, recipe, options), out, work, adapters, steps
            )
        if request.package:
            package(target, bundle)
            steps.done("packaging")
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
    say(steps.summary())
    return BakeResult(out, manifest, text, provider)


def _bake_generative(
    request: BakeRequest,
    source: ResolvedSource,
    target: Target,
    plan: tuple[str, tuple[str, Recipe] | None, dict[str, str]],
    out: Path,
    work: Path,
    adapters: list[AdapterSpec],
    steps: _StepTimes,
) -> tuple[Manifest, str, str]:
    """Build a generative model into `work/bundle/model` (`plan`: the precision, recipe
    and builder options of `_plan`), its manifest written, gated and smoke-tested.

    Returns:
        The manifest, the smoke text and the provider that loaded the model.
    """
    precision, recipe, options = plan
    staging = work / "bundle" / MODEL_SUBDIR
    # Beside the output, not in `work`: a failed bake's builder log outlives it.
    failed_log = out.with_name(f"{out.name}.builder.log")
    exact = _exact_import(source, request, precision)
    if exact and "algo_config" not in request.options:
        # The GGUF's weights replace the builder's: its lightest quantization will do
        # (og's default, onnxruntime's C++ blockwise rounding; Gemma-3-270M's
        # k_quant_mixed took 9 minutes here, and numpy's RTN held 1.4 GB more than it
        # at Qwen2.5-Coder-0.5B for the same seconds: docs/measurements.md), and no
        # recipe. A tensor the import cannot map keeps this quantization, and the bake
        # says so.
        options, recipe = {**options, "algo_config": "default"}, None
    options = _kv_cache_options(source, request, options, work / "kv-cache-scales.json")
    options = _speculative_options(source, request, options)
    precision, options, builder, inferred = _convert(
        source,
        staging,
        work / "cache",
        request,
        target,
        precision,
        options,
        failed_log,
        recipe,
        exact,
    )
    steps.done("builder" if source.folder_kind == "hf" else "graph")
    imported = (
        _import_gguf(source, staging, request.compact, request.compact_importance)
        if exact
        else None
    )
    steps.done("import")  # shown where it took time: a GGUF's exact import
    options = _fit_context(source, staging, request, options)
    added = {
        "gguf_import": imported,
        "draft": _add_draft(request, staging, work, steps),
        "adapters": _add_adapters(source, adapters, staging, steps),
    }
    manifest = _finish_folder(source, staging, target, precision, options, inferred, builder)
    manifest = manifest.model_copy(update=added)
    write_manifest(staging, manifest)
    steps.done("manifest")
    manifest, text, provider = _verify(staging, source, target, request, manifest, adapters)
    steps.done("gate")
    return manifest, text, provider


class _StepTimes:
    """How long each step of a bake took, for its last line."""

    def __init__(self) -> None:
        self._start = self._last = time.monotonic()
        self._steps: list[tuple[str, float]] = []

    def done(self, step: str) -> None:
        """`step` ended now (it began where the previous one ended)."""
        now = time.monotonic()
        self._steps.append((step, now - self._last))
        self._last = now

    def summary(self) -> str:
        """`time: source 12 s, builder 113 s, ..., total 142 s` (steps under 0.5 s, such
        as the manifest's, count in the total only)."""
        shown = [f"{step} {seconds:.0f} s" for step, seconds in self._steps if seconds >= 0.5]
        total = time.monotonic() - self._start
        return f"time: {', '.join([*shown, f'total {total:.0f} s'])}"


def _plan(
    request: BakeRequest,
) -> tuple[Target, str, tuple[str, Recipe] | None, dict[str, str], Path]:
    """The target, precision, recipe, builder options and output folder of a bake.

    Raises:
        BakeError: What cannot be baked, or an output that exists without `force`.
    """
    target = get_target(request.target)
    precision = request.precision or "int4"
    recipe = _recipe(request, target, precision)
    options = builder_options(target, precision, request.options, recipe[1] if recipe else None)
    if request.precision in ("fp16",) and target.builder_ep == "cpu":
        raise BakeError(f"precision fp16 is not supported on the CPU target {target.name}")
    out = (request.out or default_out(request.source, target.name)).resolve()
    if out.exists() and not request.force:
        raise BakeError(f"{out} already exists (use --force to replace it)")
    return target, precision, recipe, options, out


def _finish_folder(
    source: ResolvedSource,
    staging: Path,
    target: Target,
    precision: str,
    options: dict[str, str],
    inferred: list[str],
    builder: str,
) -> Manifest:
    """Complete the built folder (text settings, the target's threads); its manifest."""
    record_text(source.folder, staging)
    set_session_options(staging / "genai_config.json", target.intra_op_num_threads)
    return _manifest(source, target, precision, options, inferred, staging, builder)


def _kv_cache_options(
    source: ResolvedSource, request: BakeRequest, options: dict[str, str], scales: Path
) -> dict[str, str]:
    """The builder's options for an int8 KV cache (bake.kv_cache), calibrated here.

    Raises:
        BakeError: `--kv-cache int8` on an ONNX source (its graph is used as exported).
    """
    if request.kv_cache == "fp32":
        return options
    if source.folder_kind != "hf":
        raise BakeError(
            f"--kv-cache int8 applies to checkpoints; {source.name} is an ONNX graph, used "
            "with the cache it was exported with"
        )
    from ortserve.bake.kv_cache import SCHEME, calibrate

    with heartbeat("KV-cache calibration"):
        calibrate(source.folder, scales)
    say(f"KV cache: int8 ({SCHEME}), scales calibrated on the checkpoint in fp32")
    return {**options, "kv_cache_quant_scheme": SCHEME, "kv_cache_scale_file": str(scales)}


def _speculative_options(
    source: ResolvedSource, request: BakeRequest, options: dict[str, str]
) -> dict[str, str]:
    """The builder's options for a graph that speculative decoding can verify drafts on:
    the logits of every position (og 0.18 refuses to speculate on a pruned lm_head).

    Raises:
        BakeError: `--speculative` on an ONNX source (its graph is used as exported), or
            with `--builder-option prune_lm_head=true`.
    """
    if not (request.speculative or request.draft):
        return options
    if source.folder_kind != "hf":
        raise BakeError(
            f"--speculative and --draft apply to checkpoints; {source.name} is an ONNX graph, "
            "used as exported (the server speculates when it gives the logits of every "
            "position: /readyz says so)"
        )
    if request.options.get("prune_lm_head", "false").lower() == "true":
        raise BakeError(
            "--speculative needs the logits of every position: drop --builder-option "
            "prune_lm_head=true"
        )
    say("speculative decoding: the graph keeps the logits of every position")
    return {**options, "prune_lm_head": "false"}


# The draft model's files in the baked folder: its graph and the graph's weights only (the
# model's own tokenizer and settings serve both).
DRAFT_SUBDIR = "draft"


def _add_draft(request: BakeRequest, staging: Path, work: Path, steps: _StepTimes) -> str | None:
    """Bake `request.draft` (if any) for the same target and precision (its own defaults,
    quality gate included) and put its graph in `staging/draft/`, named in genai_config's
    `model.draft`; returns its name for the manifest (None: no draft).

    Raises:
        BakeError: The draft's vocabulary is not the model's (og verifies a draft's token
            ids against the model's: they must mean the same text).
    """
    if request.draft is None:
        return None
    say(f"draft model: baking {request.draft}")
    drafted = bake(
        BakeRequest(
            source=request.draft,
            target=request.target,
            out=work / "draft-bake",
            precision=request.precision,
            force=True,
            package=False,
            quality_check=request.quality_check,
            cache_dir=request.cache_dir,
            context_length=request.context_length,
        )
    )
    folder = drafted.folder / MODEL_SUBDIR
    _check_same_vocabulary(staging, folder, request.draft)
    graph = json.loads((folder / "genai_config.json").read_text(encoding="utf-8"))
    filename = graph["model"]["decoder"]["filename"]
    (staging / DRAFT_SUBDIR).mkdir()
    for path in folder.iterdir():  # the graph and its external data
        if path.name == filename or path.name.startswith(f"{filename}."):
            shutil.move(path, staging / DRAFT_SUBDIR / path.name)
    add_draft(
        staging / "genai_config.json", folder / "genai_config.json", f"{DRAFT_SUBDIR}/{filename}"
    )
    say(f"draft model: {drafted.manifest.model_name} in {DRAFT_SUBDIR}/")
    steps.done("draft")
    return f"{drafted.manifest.model_name} ({request.draft})"


def _adapter_specs(request: BakeRequest) -> list[AdapterSpec]:
    """`--adapter NAME=PATH`s, checked before anything is built.

    Raises:
        BakeError: A malformed one, or two of one name.
    """
    specs = [AdapterSpec.parse(text) for text in request.adapters]
    names = [spec.name for spec in specs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise BakeError(f"--adapter {twice[0]} is given twice: one adapter a name")
    return specs


def _add_adapters(
    source: ResolvedSource, specs: list[AdapterSpec], staging: Path, steps: _StepTimes
) -> list[Adapter]:
    """Give the baked graph its adapter inputs and write each adapter's file (bake.lora);
    what the manifest says of them.

    Raises:
        BakeError: An ONNX source (its graph is used as exported), or an adapter that
            does not fit the model (bake.lora.convert).
    """
    if not specs:
        return []
    if source.folder_kind != "hf":
        raise BakeError(
            f"--adapter applies to checkpoints; {source.name} is an ONNX graph, used as exported"
        )
    from ortserve.bake.lora import adapted_modules, add_sites, convert, write_adapter

    modules = set().union(*(adapted_modules(spec) for spec in specs))
    sites, io_type = add_sites(staging, modules)
    baked = []
    for spec in specs:
        converted = convert(spec, sites)
        adapter = Adapter(
            name=spec.name,
            source=str(spec.path),
            rank=converted.rank,
            alpha=converted.alpha,
            modules=list(converted.modules),
        )
        write_adapter(converted.tensors, staging / adapter.file, io_type)
        size = (staging / adapter.file).stat().st_size
        say(
            f"adapter {spec.name}: LoRA rank {converted.rank} on {', '.join(converted.modules)} "
            f"({size / 1e6:.1f} MB), served as MODEL:{spec.name}"
        )
        baked.append(adapter)
    steps.done("adapters")
    return baked


def _check_same_vocabulary(model: Path, draft: Path, name: str) -> None:
    """Refuse a draft whose tokens are not the model's: the same vocabulary size in
    genai_config, and (where both folders have one) the same tokenizer.json vocabulary,
    merges and added tokens."""

    def vocabulary(folder: Path) -> tuple[object, ...]:
        config = json.loads((folder / "genai_config.json").read_text(encoding="utf-8"))
        tokenizer = folder / "tokenizer.json"
        if not tokenizer.is_file():
            return (config["model"].get("vocab_size"),)
        data = json.loads(tokenizer.read_text(encoding="utf-8"))
        return config["model"].get("vocab_size"), data.get("model"), data.get("added_tokens")

    ours, theirs = vocabulary(model), vocabulary(draft)
    if len(ours) != len(theirs) or ours != theirs:
        raise BakeError(
            f"--draft {name}: its vocabulary is not this model's (a draft's token ids must "
            "mean the same text: a smaller model of the same family)"
        )


def _exact_import(source: ResolvedSource, request: BakeRequest, precision: str) -> bool:
    """Whether the GGUF's own weights go into the graph (bake.gguf_import).

    Raises:
        BakeError: `--recipe` on a GGUF source without `--requantize` (a recipe chooses
            how the builder quantizes; the GGUF's weights are already quantized).
    """
    if request.compact_importance != "weights" and not request.compact:
        raise BakeError("--compact-importance applies to --compact")
    if request.compact and (source.gguf is None or request.requantize or precision != "int4"):
        raise BakeError(
            "--compact applies to the exact import of a GGUF source at int4 (not with "
            "--requantize, another precision, or a checkpoint)"
        )
    if source.gguf is None or request.requantize or precision != "int4":
        if source.gguf is not None and precision == "int4":
            say(
                f"GGUF {source.gguf.name}: --requantize, so the builder quantizes its "
                "dequantized weights again"
            )
        return False
    if request.recipe is not None:
        raise BakeError(
            f"--recipe chooses how the builder quantizes; {source.gguf.name}'s weights are "
            "imported as they are quantized in the file: add --requantize to quantize its "
            "dequantized weights with the recipe instead"
        )
    return True


def _fit_context(
    source: ResolvedSource, staging: Path, request: BakeRequest, options: dict[str, str]
) -> dict[str, str]:
    """Size a built model's context (bake.context); the manifest's options say a cut.

    Raises:
        BakeError: `--context-length` on an ONNX source (its graph is used as exported),
            or above the model's maximum.
    """
    from ortserve.bake.context import fit_context

    if source.folder_kind != "hf":
        if request.context_length is not None:
            raise BakeError(
                f"--context-length applies to checkpoints; {source.name} is an ONNX graph, "
                "used with the context it was exported for"
            )
        return options
    tokens = fit_context(staging, request.context_length)
    return options if tokens is None else {**options, "context_length": str(tokens)}


def _import_gguf(
    source: ResolvedSource, staging: Path, compact: bool, compact_importance: str
) -> GgufImport:
    """Put the GGUF's quantized weights into the builder's graph, exactly (or, with
    `compact`, the 8-bit forms as 4-bit blocks, weighed by `compact_importance`)."""
    from ortserve.bake.gguf_import import import_exact
    from ortserve.core.manifest import sha256_file

    assert source.gguf is not None
    config = json.loads((staging / "genai_config.json").read_text(encoding="utf-8"))
    graph = str(config["model"]["decoder"]["filename"])
    importance = None
    if compact and compact_importance == "activations":
        from ortserve.bake.importance import collect

        importance = collect(source.folder)
    with heartbeat("GGUF import"):
        report = import_exact(source.gguf, staging, source.folder, graph, compact, importance)
    return GgufImport(
        file=source.gguf.name,
        sha256=sha256_file(source.gguf),
        exact=report.exact,
        requantized=report.requantized,
        compacted=report.compacted,
    )


def _expand(
    recipe: tuple[str, Recipe], asked: bool, config: dict[str, Any], options: dict[str, str]
) -> tuple[tuple[str, Recipe], dict[str, Any] | None]:
    """The recipe for this checkpoint (a target's default may fall back: bake.recipes) and
    the builder's `--target_options` it expands to (None: no per-layer rules)."""
    if not asked:
        name = default_recipe(recipe[0], config)
        if name != recipe[0]:
            say(
                f"recipe {recipe[0]} names llama-like nodes; a {config.get('model_type')} "
                f"checkpoint gets {name} (--recipe to choose)"
            )
        recipe = name, RECIPES[name]
    expanded = target_options(recipe[1], options, config)
    count = len(expanded["quant_config"]["weights"]["overrides"]) if expanded else 0
    say(
        f"recipe {recipe[0]}: {count} builder overrides"
        if count
        else f"recipe {recipe[0]}: no per-layer rules"
    )
    return recipe, expanded


def _recipe(request: BakeRequest, target: Target, precision: str) -> tuple[str, Recipe] | None:
    """The recipe of an int4 bake (`--recipe`, else the target's) and how the manifest
    records it: a name, or a file's recipe as JSON.

    Raises:
        BakeError: `--recipe` with another precision, or a recipe that cannot load.
    """
    if request.recipe is None:
        if precision != "int4" or target.recipe is None:
            return None
        return target.recipe, RECIPES[target.recipe]
    if precision != "int4":
        raise BakeError(
            f"--recipe applies to int4 bakes (it raises chosen weights to int8), not "
            f"--precision {precision}"
        )
    label, recipe = load_recipe(request.recipe)
    if label not in RECIPES:
        label = recipe.model_dump_json()
    return label, recipe


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
    builder: str,
) -> Manifest:
    from importlib.metadata import version

    og_version = version("onnxruntime-genai")
    builder_version = builder.format(og=og_version, ort=version("onnxruntime"))
    return Manifest(
        model_name=source.name,
        random_weights=source.random_weights,
        source=str(source.folder) if source.kind in ("local-hf", "onnx") else source.spec,
        source_kind=source.kind,
        revision=source.revision,
        precision=precision,
        target=target.name,
        arch=target.arch,
        execution_provider=target.runtime_ep,
        # The KV-cache scales are in the graph; their file was the bake's own.
        builder_options={k: v for k, v in options.items() if k != "kv_cache_scale_file"},
        onnxruntime_genai_version=og_version,
        builder_version=builder_version,
        inferred=inferred,
        sampling=recorded_sampling(source.folder),
        files=list_files(folder),
    )

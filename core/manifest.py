"""The manifest of a baked model folder: what was baked, from what, and every file's size and hash.

The bake writes it; the runtime checks it at load so that a half-copied or tampered
model is refused with an error that names the file.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from ortserve.core.errors import ModelIntegrityError
from ortserve.core.generation import SamplingDefaults

MANIFEST_NAME = "manifest.json"
_CHUNK = 1 << 20

SourceKind = Literal["builtin", "hub", "local-hf", "onnx", "s3", "gguf", "pypi", "catalog"]
# What a baked folder serves: text generation (an onnxruntime-genai folder, core.engine) or
# sentence embeddings (a plain onnxruntime graph, core.embedding).
ModelKind = Literal["generative", "embedding"]


class ManifestFile(BaseModel):
    """One file of the baked folder."""

    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class QualityCheck(BaseModel):
    """The bake's quality gate: the baked model scored against its source model.

    A generative model's gate fills the perplexity fields; an embedding model's (bake.embedding)
    the cosine and retrieval fields. Each field is optional, so manifests written before
    either kind existed still load.

    Attributes:
        status: `passed`, `failed`, `not enforced (random weights)`, or `skipped: WHY`.
        reference: What the baked model was compared with.
        scored_tokens: Positions scored on the gate's built-in text.
        ppl_reference: The reference's perplexity on that text.
        ppl: The baked model's perplexity.
        ppl_ratio: `ppl` ÷ `ppl_reference`; the gate fails above `max_ppl_ratio`.
        top1_agreement: Share of positions where both pick the same next token.
        kl_divergence: Mean KL(reference ‖ baked), nats.
        max_ppl_ratio: The limit the bake applied.
        sentences: Held-out sentences embedded by both (an embedding model's gate).
        cosine_mean: Mean cosine similarity, baked vs reference, over those sentences.
        cosine_min: The lowest; the gate fails below `min_cosine`.
        min_cosine: The limit the bake applied.
        queries: Queries of the retrieval check (each against every sentence).
        retrieval_agreement: Share of queries whose nearest sentence is the same under
            both; the gate fails below 1 (every query).
    """

    status: str
    reference: str | None = None
    scored_tokens: int | None = None
    ppl_reference: float | None = None
    ppl: float | None = None
    ppl_ratio: float | None = None
    top1_agreement: float | None = None
    kl_divergence: float | None = None
    max_ppl_ratio: float | None = None
    sentences: int | None = None
    cosine_mean: float | None = None
    cosine_min: float | None = None
    min_cosine: float | None = None
    queries: int | None = None
    retrieval_agreement: float | None = None

    def summary(self) -> str:
        """One line for people: the verdict and the figures."""
        if self.cosine_min is not None:
            return (
                f"{self.status}: cosine to the reference mean {self.cosine_mean:.4f}, min "
                f"{self.cosine_min:.4f} (limit {self.min_cosine}) over {self.sentences} "
                f"sentences; the same nearest sentence for {self.retrieval_agreement:.0%} of "
                f"{self.queries} queries"
            )
        if self.ppl_ratio is None:
            return self.status
        return (
            f"{self.status}: perplexity {self.ppl:.2f} vs {self.ppl_reference:.2f} "
            f"({self.ppl_ratio:.3f}x, limit {self.max_ppl_ratio}), top-1 agreement "
            f"{self.top1_agreement:.1%}, KL {self.kl_divergence:.4f} over "
            f"{self.scored_tokens} tokens"
        )


class GgufImport(BaseModel):
    """How a GGUF source's weights reached the baked graph.

    Attributes:
        file: The GGUF file's name.
        sha256: Its sha256.
        exact: GGUF tensor → its type, for the weights imported bit for bit.
        requantized: GGUF tensor → why the builder's quantization of it was kept.
        compacted: GGUF tensor → its type, for the 8-bit forms a compact import made
            4-bit (`ortserve bake --compact`).
    """

    file: str
    sha256: str
    exact: dict[str, str] = Field(default_factory=dict)
    requantized: dict[str, str] = Field(default_factory=dict)
    compacted: dict[str, str] = Field(default_factory=dict)

    def summary(self) -> str:
        """One line for people: which types came over exactly, and what did not."""
        counts: dict[str, int] = {}
        for kind in self.exact.values():
            counts[kind] = counts.get(kind, 0) + 1
        types = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        line = f"{len(self.exact)} weights exact from {self.file} ({types or 'none'})"
        if self.compacted:
            line += f"; {len(self.compacted)} made 4-bit (compact)"
        if self.requantized:
            line += f"; {len(self.requantized)} requantized by the builder"
        return line


#: An adapter's name: served as `MODEL:NAME` and stored as `adapters/NAME.onnx_adapter`.
ADAPTER_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
#: Where a baked folder keeps its adapters, one file each.
ADAPTERS_SUBDIR = "adapters"
ADAPTER_SUFFIX = ".onnx_adapter"


def adapter_file(name: str) -> str:
    """Adapter `name`'s file, relative to the model folder."""
    return f"{ADAPTERS_SUBDIR}/{name}{ADAPTER_SUFFIX}"


class Adapter(BaseModel):
    """A LoRA adapter baked beside the model (`ortserve bake --adapter NAME=PATH`).

    Attributes:
        name: Served as `MODEL:NAME`.
        source: The PEFT adapter folder it was baked from.
        rank: Its LoRA rank (the largest, where modules differ).
        alpha: Its `lora_alpha` (the scale `alpha / rank` is in its weights).
        modules: The projections it adapts (q_proj, v_proj, ...).
        quality: The base model with it, scored against transformers + PEFT on the same
            ids (the base's gate text).
    """

    name: str = Field(pattern=ADAPTER_NAME)
    source: str
    rank: int = Field(ge=1)
    alpha: float
    modules: list[str]
    quality: QualityCheck | None = None

    @property
    def file(self) -> str:
        """Its file, relative to the model folder."""
        return adapter_file(self.name)


class Manifest(BaseModel):
    """What a baked folder holds and how it was made.

    Attributes:
        model_name: Name shown to users (the model id of the API); random-weight
            built-ins say so in the name.
        random_weights: True when the weights are random (test and benchmark models).
        inferred: What the bake had to infer (e.g. genai_config fields), one line each.
        quality: The bake's quality gate (None: baked before the gate existed).
        gguf_import: For a GGUF source baked without re-quantization, what came over
            exactly (None: not a GGUF source, or `--requantize`).
        arch: The CPU architecture the target runs on (`x86_64`, `aarch64`; None: baked
            before the manifest said).
        sampling: The model's own sampling defaults, from the source's
            generation_config.json (a catalog entry's written there); None: it states
            none, or baked before the manifest said (the house profile applies).
        draft: The draft model baked beside it (`--draft`, in `draft/`), by name and source.
        adapters: The LoRA adapters baked beside it (`--adapter`), served as `MODEL:NAME`.
        kind: `generative` (an onnxruntime-genai folder) or `embedding` (an onnxruntime
            graph with its `embedding.json`, core.embedding); manifests written before
            the field say nothing and are generative. An embedding folder's
            `onnxruntime_genai_version` is the bake environment's (og does not run it) and
            its `builder_version` names the exporter and quantizer.
    """

    schema_version: Literal[1] = 1
    kind: ModelKind = "generative"
    model_name: str
    random_weights: bool = False
    source: str
    source_kind: SourceKind
    revision: str | None = None
    precision: str
    target: str
    arch: str | None = None
    execution_provider: str
    builder_options: dict[str, str] = Field(default_factory=dict)
    onnxruntime_genai_version: str
    builder_version: str
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())
    inferred: list[str] = Field(default_factory=list)
    quality: QualityCheck | None = None
    gguf_import: GgufImport | None = None
    sampling: SamplingDefaults | None = None
    draft: str | None = None
    adapters: list[Adapter] = Field(default_factory=list)
    files: list[ManifestFile]

    @property
    def kv_cache_element_bytes(self) -> int:
        """Bytes one cached key or value element takes: 1 for an int8 cache
        (`--kv-cache int8`), else 4 (fp32, og 0.18's CPU default)."""
        scheme = self.builder_options.get("kv_cache_quant_scheme", "none")
        return 1 if scheme.startswith(("int8", "fp8")) else 4


_MACHINES = {"arm64": "aarch64", "amd64": "x86_64"}  # platform.machine()'s other names


def arch_mismatch(manifest: Manifest, machine: str) -> str | None:
    """Why a model baked for another CPU architecture than `machine` (platform.machine())
    will not run well here, or None when it matches (or the manifest does not say)."""
    here = _MACHINES.get(machine.lower(), machine.lower())
    if manifest.arch is None or manifest.arch == here:
        return None
    return (
        f"the model was baked for target {manifest.target} ({manifest.arch}) but this "
        f"machine is {here}: bake for the right target (onnxruntime-genai's wheels and the "
        "image's architecture must match)"
    )


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def list_files(folder: Path) -> list[ManifestFile]:
    """Describe every regular file under `folder` (the manifest itself excluded)."""
    entries = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel == MANIFEST_NAME:
            continue
        entries.append(ManifestFile(path=rel, size=path.stat().st_size, sha256=sha256_file(path)))
    return entries


def write_manifest(folder: Path, manifest: Manifest) -> Path:
    """Write `manifest.json` into `folder` and return its path."""
    target = folder / MANIFEST_NAME
    target.write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return target


def manifest_digest(folder: Path) -> str:
    """The sha256 of the manifest file: one id for the exact baked model."""
    return sha256_file(folder / MANIFEST_NAME)


def read_manifest(folder: Path) -> Manifest:
    """Read and validate `folder/manifest.json`.

    Raises:
        ModelIntegrityError: The folder or its manifest is missing or unreadable.
    """
    path = folder / MANIFEST_NAME
    if not folder.is_dir():
        raise ModelIntegrityError(f"model folder {folder} does not exist")
    if not path.is_file():
        inner = folder / "model"
        if (inner / MANIFEST_NAME).is_file():  # a bundle: its model is in model/
            raise ModelIntegrityError(
                f"{path} is missing: {folder} is a bundle; its model folder is {inner}"
            )
        raise ModelIntegrityError(f"{path} is missing: is {folder} a baked model folder?")
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise ModelIntegrityError(
            f"{path} is not a valid ortserve manifest ({exc.error_count()} problem(s))"
        ) from exc


def verify_folder(folder: Path, *, full_hash: bool = False) -> Manifest:
    """Check that every file the manifest lists is present with its size (and hash).

    Args:
        folder: The baked model folder.
        full_hash: Also compare every file's sha256 (reads every byte).

    Returns:
        The manifest.

    Raises:
        ModelIntegrityError: Naming the first file that is missing, truncated or altered.
    """
    manifest = read_manifest(folder)
    root = folder.resolve()
    for entry in manifest.files:
        path = folder / entry.path
        if not path.resolve().is_relative_to(root):
            # Never stat (and so report on) a file outside the model folder.
            raise ModelIntegrityError(f"the manifest lists a file outside {folder}")
        if not path.is_file():
            raise ModelIntegrityError(f"model file {entry.path} is missing from {folder}")
        size = path.stat().st_size
        if size != entry.size:
            raise ModelIntegrityError(
                f"model file {entry.path} has {size} bytes, the manifest says {entry.size}"
                " (truncated or half-copied?)"
            )
        if full_hash and sha256_file(path) != entry.sha256:
            raise ModelIntegrityError(
                f"model file {entry.path} does not match its sha256 in the manifest (altered?)"
            )
    return manifest

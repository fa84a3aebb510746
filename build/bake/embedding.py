"""Embedding models in the bake: a sentence-transformers folder → `model.onnx` + gate.

A sentence-transformers folder (its `modules.json`: a Transformer, a Pooling, maybe a
Normalize) is the source. onnxruntime-genai runs decoders only, so an embedding model is
baked for plain onnxruntime (core.embedding runs it):

1. export: the transformers model with the folder's own pooling (read from its Pooling
   config: mean over the attention mask, CLS, max, or mean ÷ √length) and, where the
   folder has a Normalize module, L2 normalisation, as one graph, `torch.onnx.export`
   (inputs `input_ids`, `attention_mask`, and `token_type_ids` where the model takes
   them; dynamic batch and sequence axes; output `sentence_embedding` [batch, dim]);
2. quantize: int8 weights with onnxruntime's dynamic quantization (per channel; the
   activations are quantized at run time), unless the gate refuses it, then fp32;
3. the quality gate: the baked folder, loaded as the runtime loads it, against
   sentence-transformers in fp32 (torch) on held-out sentences (data/embedding_gate.json):
   the cosine of each sentence's two vectors (mean and min; the gate fails below the
   precision's bound) and a retrieval check: each query's nearest sentence must be the
   one sentence-transformers picks.

`embedding.json` records what the runtime needs (dimensions, max_tokens, pad id, ...);
the manifest says `kind: embedding` and holds the gate's figures.
"""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortserve.bake.errors import BakeError, heartbeat, say
from ortserve.core.embedding import EMBEDDING_CONFIG, GRAPH, OUTPUT, EmbeddingConfig
from ortserve.core.manifest import Manifest, QualityCheck, list_files, write_manifest

if TYPE_CHECKING:  # torch, numpy and transformers load when a bake exports
    import numpy as np

    from ortserve.bake.pipeline import BakeRequest
    from ortserve.bake.sources import ResolvedSource
    from ortserve.bake.targets import Target

MODULES = "modules.json"
GATE_DATA = Path(__file__).parent / "data" / "embedding_gate.json"
PRECISIONS = ("int8", "fp32")
# The gate's bound on the lowest cosine (baked vs sentence-transformers fp32) per precision.
# Measured on all-MiniLM-L6-v2 and the gate's 152 texts (docs/measurements.md, "Embeddings"):
# int8 per-channel dynamic quantization 0.9883 at the lowest (mean 0.9935); per-tensor int8,
# a worse recipe, 0.943. 0.98 keeps the first and refuses the second. An fp32 export differs
# from torch by float rounding only (measured 1 - 1e-7).
MIN_COSINE = {"int8": 0.98, "fp32": 0.9999}
# Pooling modes the export writes into the graph (sentence-transformers' names).
POOLINGS = ("mean", "cls", "max", "mean_sqrt_len_tokens")
_LEGACY_POOLING = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# The tokenizer's files copied beside the graph (core.embedding reads tokenizer.json).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_OPSET = 17


@dataclass(frozen=True)
class Layout:
    """What a sentence-transformers folder says about its model.

    Attributes:
        root: The folder (its modules.json).
        transformer: The Transformer module's folder (config.json, weights, tokenizer).
        pooling: The Pooling module's mode (`POOLINGS`).
        normalize: Whether a Normalize module follows the pooling.
        dimensions: Length of the pooled vector.
        max_tokens: sentence-transformers' `max_seq_length` (special tokens included).
        lowercase: The Transformer's `do_lower_case` (text lowercased before tokenizing).
    """

    root: Path
    transformer: Path
    pooling: str
    normalize: bool
    dimensions: int
    max_tokens: int
    lowercase: bool


def is_sentence_transformers(folder: Path) -> bool:
    """Whether `folder` is a sentence-transformers model: a modules.json with a Pooling
    module (what makes a checkpoint an embedding model here)."""
    try:
        modules = json.loads((folder / MODULES).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(modules, list) and any(
        isinstance(m, dict) and _module_type(m) == "Pooling" for m in modules
    )


def _module_type(module: dict[str, Any]) -> str:
    # "sentence_transformers.models.Pooling" (and ST 6's longer paths) -> "Pooling"
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError:
        return {}
    except ValueError as exc:
        raise BakeError(f"{path} is not valid JSON ({exc})") from exc
    return data if isinstance(data, dict) else {}


def pooling_mode(config: dict[str, Any]) -> str:
    """The one pooling mode a Pooling module's config.json names: `pooling_mode` (newer
    sentence-transformers) or the `pooling_mode_*` flags (older); mean when it names none,
    as sentence-transformers reads it.

    Raises:
        BakeError: Several modes (a concatenation) or one the export does not write.
    """
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [name for key, name in _LEGACY_POOLING.items() if config.get(key)]
        mode = modes if len(modes) > 1 else (modes[0] if modes else "mean")
    if isinstance(mode, list):
        mode = mode[0] if len(mode) == 1 else mode
    if not isinstance(mode, str):
        raise BakeError(
            f"the Pooling module concatenates several modes ({', '.join(map(str, mode))}): "
            "the bake exports one"
        )
    if mode not in POOLINGS:
        raise BakeError(
            f"pooling mode {mode!r} is not supported by the bake's export (it writes "
            f"{', '.join(POOLINGS)})"
        )
    return mode


def read_layout(folder: Path) -> Layout:
    """Read the modules, pooling and normalisation of the sentence-transformers `folder`.

    Raises:
        BakeError: A module the bake cannot export (Dense, a second Transformer...), no
            Transformer or no Pooling, or a pooling it does not write.
    """
    modules = json.loads((folder / MODULES).read_text(encoding="utf-8"))
    kinds = [_module_type(m) for m in modules]
    unknown = sorted({k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")})
    if unknown:
        raise BakeError(
            f"{folder / MODULES} has module(s) {', '.join(unknown)}: the bake exports a "
            "Transformer, its Pooling and a Normalize only"
        )
    if kinds.count("Transformer") != 1 or kinds.count("Pooling") != 1:
        raise BakeError(f"{folder / MODULES} must have one Transformer and one Pooling module")
    if kinds.index("Transformer") > kinds.index("Pooling"):
        raise BakeError(f"{folder / MODULES}: the Pooling module comes before the Transformer")
    by_type = {k: m for k, m in zip(kinds, modules, strict=True)}
    transformer = folder / str(by_type["Transformer"].get("path", ""))
    pooling = _json(folder / str(by_type["Pooling"].get("path", "")) / "config.json")
    st_config = _json(transformer / "sentence_bert_config.json")
    model_config = _json(transformer / "config.json")
    dimensions = (
        pooling.get("embedding_dimension")
        or pooling.get("word_embedding_dimension")
        or model_config.get("hidden_size")
    )
    max_tokens = st_config.get("max_seq_length") or model_config.get("max_position_embeddings")
    if not dimensions or not max_tokens:
        raise BakeError(
            f"{folder} says neither its vector's length nor its longest input "
            "(1_Pooling/config.json, sentence_bert_config.json, config.json)"
        )
    return Layout(
        root=folder,
        transformer=transformer,
        pooling=pooling_mode(pooling),
        normalize="Normalize" in kinds,
        dimensions=int(dimensions),
        max_tokens=int(max_tokens),
        lowercase=bool(st_config.get("do_lower_case", False)),
    )


@dataclass(frozen=True)
class GateText:
    """The gate's held-out sentences and its retrieval queries."""

    sentences: list[str]
    queries: list[str]

    @classmethod
    def load(cls, path: Path = GATE_DATA) -> GateText:
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls([str(s) for s in data["sentences"]], [str(q) for q in data["queries"]])

    @property
    def texts(self) -> list[str]:
        return [*self.sentences, *self.queries]


def reference_vectors(layout: Layout, texts: list[str]) -> np.ndarray[Any, Any]:
    """sentence-transformers' vectors of `texts` (fp32, torch on the CPU): the gate's
    reference.

    Raises:
        BakeError: sentence-transformers reads the folder otherwise than `read_layout`
            (its longest input or vector length differ).
    """
    import numpy as np
    from sentence_transformers import SentenceTransformer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = SentenceTransformer(str(layout.root), device="cpu")
        vectors = model.encode(texts, batch_size=32, convert_to_numpy=True)
    if model.max_seq_length != layout.max_tokens:
        raise BakeError(
            f"sentence-transformers takes {model.max_seq_length} tokens, the bake read "
            f"{layout.max_tokens} from {layout.root}"
        )
    out: np.ndarray[Any, Any] = np.asarray(vectors, dtype=np.float32)
    if out.shape != (len(texts), layout.dimensions):
        raise BakeError(f"sentence-transformers gives vectors of shape {out.shape[1:]}")
    return out


def export(layout: Layout, graph: Path) -> list[str]:
    """Write `layout`'s model with its pooling and normalisation as one fp32 ONNX graph
    at `graph`; returns its inputs."""
    import inspect

    import torch
    from transformers import AutoModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        # eager attention: the plainest graph (sdpa's masks trace with shape checks)
        model = AutoModel.from_pretrained(
            str(layout.transformer), dtype=torch.float32, attn_implementation="eager"
        ).eval()
        takes_types = "token_type_ids" in inspect.signature(model.forward).parameters
        wrapped = _pooled(model, layout.pooling, layout.normalize, takes_types)
        names = ["input_ids", "attention_mask", *(["token_type_ids"] if takes_types else [])]
        # Any ids in the vocabulary: the axes are dynamic; the second row is padded.
        ids = torch.tensor([[3, 4, 5, 6, 7, 8], [3, 9, 8, 0, 0, 0]])
        mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
        example = (ids, mask, *([torch.zeros_like(ids)] if takes_types else []))
        axes: dict[str, dict[int, str]] = {n: {0: "batch", 1: "sequence"} for n in names}
        axes[OUTPUT] = {0: "batch"}
        torch.onnx.export(
            wrapped,
            example,
            str(graph),
            dynamo=False,
            input_names=names,
            output_names=[OUTPUT],
            dynamic_axes=axes,
            opset_version=_OPSET,
        )
    return names


def _pooled(model: Any, pooling: str, normalize: bool, types: bool) -> Any:
    """`model`, then the folder's pooling (and normalisation), as one torch module."""
    import torch

    class Pooled(torch.nn.Module):
        """The transformer, then the folder's pooling (and normalisation), in one graph."""

        def __init__(self, model: Any, pooling: str, normalize: bool, types: bool) -> None:
            super().__init__()
            self.model, self.pooling, self.normalize, self.types = model, pooling, normalize, types

        def forward(self, input_ids: Any, attention_mask: Any, *rest: Any) -> Any:
            extra = {"token_type_ids": rest[0]} if self.types else {}
            hidden = self.model(
                input_ids=input_ids, attention_mask=attention_mask, **extra
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            if self.pooling == "cls":
                pooled = hidden[:, 0]
            elif self.pooling == "max":
                pooled = hidden.masked_fill(mask == 0, float("-inf")).max(dim=1).values
            else:
                count = torch.clamp(mask.sum(dim=1), min=1e-9)
                if self.pooling == "mean_sqrt_len_tokens":
                    count = torch.sqrt(count)
                pooled = (hidden * mask).sum(dim=1) / count
            if self.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            return pooled

    return Pooled(model, pooling, normalize, types)


def quantize(fp32: Path, out: Path) -> None:
    """int8 weights (per output channel) by onnxruntime's dynamic quantization; the
    activations are quantized at run time, per pass (core.embedding runs int8 graphs a
    row at a time so that a text's vector does not depend on its batch)."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    quiet = logging.getLogger()
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "consider pre-processing": not for a dynamic quantization
    try:
        quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8, per_channel=True)
    finally:
        quiet.setLevel(level)


def _pad_id(tokenizer_json: Path) -> int:
    data = _json(tokenizer_json)
    padding = data.get("padding") or {}
    if isinstance(padding.get("pad_id"), int):
        return int(padding["pad_id"])
    for token in data.get("added_tokens") or []:
        if token.get("content") in ("[PAD]", "<pad>"):
            return int(token["id"])
    return 0


def _tokenizer_files(layout: Layout, dst: Path) -> None:
    """The tokenizer's files beside the graph (tokenizer.json made from transformers'
    fast tokenizer where the folder has none)."""
    for name in _TOKENIZER_FILES:
        if (layout.transformer / name).is_file():
            shutil.copy2(layout.transformer / name, dst / name)
    if not (dst / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(layout.transformer))
        if not getattr(tokenizer, "is_fast", False):
            raise BakeError(f"{layout.transformer} has no tokenizer.json and no fast tokenizer")
        tokenizer.backend_tokenizer.save(str(dst / "tokenizer.json"))


def gate(
    folder: Path, text: GateText, reference: np.ndarray[Any, Any], precision: str
) -> QualityCheck:
    """Load `folder` as the runtime does (core.embedding) and score it against
    `reference` (sentence-transformers' vectors of `text.texts`)."""
    import numpy as np

    from ortserve.core.embedding import EmbeddingModel

    model = EmbeddingModel.load(folder, threads=0)
    ids = [model.truncate(row) for row in model.tokenize(text.texts)]
    baked = model.embed(ids)
    cosine = (baked * reference).sum(axis=1) / (
        np.linalg.norm(baked, axis=1) * np.linalg.norm(reference, axis=1)
    )
    n = len(text.sentences)
    top_baked = (baked[n:] @ baked[:n].T).argmax(axis=1)
    top_reference = (reference[n:] @ reference[:n].T).argmax(axis=1)
    agreement = float(np.mean(top_baked == top_reference))
    bound = MIN_COSINE[precision]
    passed = float(cosine.min()) >= bound and agreement == 1.0
    return QualityCheck(
        status="passed" if passed else "failed",
        reference="sentence-transformers fp32 (torch) of the source folder",
        sentences=len(text.texts),
        cosine_mean=round(float(cosine.mean()), 5),
        cosine_min=round(float(cosine.min()), 5),
        min_cosine=bound,
        queries=len(text.queries),
        retrieval_agreement=round(agreement, 4),
    )


def refuse_generative_options(request: BakeRequest) -> None:
    """What applies to generative models only, refused for an embedding source.

    Raises:
        BakeError: Naming the first such option.
    """
    asked = {
        "--builder-option/--block-size/--accuracy-level": bool(request.options),
        "--recipe": request.recipe is not None,
        "--onnx-file": request.onnx_file is not None,
        "--kv-cache": request.kv_cache != "fp32",
        "--speculative": request.speculative,
        "--draft": request.draft is not None,
        "--adapter": bool(request.adapters),
        "--context-length": request.context_length is not None,
        "--requantize": request.requantize,
        "--compact": request.compact,
    }
    for option, given in asked.items():
        if given:
            raise BakeError(
                f"{option} applies to generative models; {request.source} is an embedding "
                "model (exported for onnxruntime with its pooling, int8 where the gate allows)"
            )
    if request.precision is not None and request.precision not in PRECISIONS:
        raise BakeError(
            f"--precision {request.precision}: an embedding model is baked int8 (where its "
            "quality gate allows, the default) or fp32"
        )


def bake_embedding(
    source: ResolvedSource, staging: Path, request: BakeRequest, target: Target, work: Path
) -> tuple[Manifest, str]:
    """Export, quantize and gate the sentence-transformers `source` into `staging`:
    int8 when the gate passes it, else fp32 (without `--precision`; with it, that
    precision or a failed bake).

    Returns:
        The manifest (written, with the gate's figures) and a line that says what a
        sentence's vector came out as (the embedding model's smoke test).

    Raises:
        BakeError: An option for generative models, a module the export cannot write,
            or a gate that fails.
    """
    refuse_generative_options(request)
    layout = read_layout(source.folder)
    say(
        f"embedding model: {layout.dimensions} dimensions, {layout.pooling} pooling"
        f"{', normalized' if layout.normalize else ''}, up to {layout.max_tokens} tokens"
    )
    if target.runtime_ep != "cpu":
        say(f"target {target.name}: an embedding model runs on onnxruntime's CPU provider")
    text = GateText.load()
    reference = None
    if request.quality_check:
        with heartbeat("quality gate, the reference"):
            say(
                f"quality gate: embedding {len(text.texts)} held-out texts with "
                "sentence-transformers fp32"
            )
            reference = reference_vectors(layout, text.texts)
    fp32 = work / "export" / GRAPH
    fp32.parent.mkdir(parents=True, exist_ok=True)
    with heartbeat("ONNX export"):
        inputs = export(layout, fp32)
    say(f"exported {GRAPH} with torch.onnx (inputs {', '.join(inputs)}; output {OUTPUT})")
    choices = [request.precision] if request.precision else list(PRECISIONS)
    for precision in choices:
        manifest = _stage(source, layout, staging, fp32, precision, target)
        if reference is None:
            say("quality gate: skipped (--no-quality-check)")
            quality = QualityCheck(status="skipped: --no-quality-check")
        else:
            with heartbeat("quality gate, the baked model"):
                quality = gate(staging, text, reference, precision)
            say(f"quality gate ({precision}): {quality.summary()}")
            if quality.status != "passed":
                if precision != choices[-1]:
                    say(f"quality gate: {precision} refused; baking {choices[-1]} instead")
                    continue
                raise BakeError(
                    f"quality gate failed at {precision}: {quality.summary()}"
                    + ("" if request.precision is None else " (try --precision fp32)")
                )
        manifest = manifest.model_copy(update={"quality": quality})
        write_manifest(staging, manifest)
        return manifest, _smoke(staging)
    raise AssertionError("unreachable: the last precision returns or raises")


def _stage(
    source: ResolvedSource,
    layout: Layout,
    staging: Path,
    fp32: Path,
    precision: str,
    target: Target,
) -> Manifest:
    """Write the baked folder at `precision` into `staging` (emptied first): graph,
    tokenizer, embedding.json, manifest."""
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    if precision == "int8":
        say("quantizing to int8 with onnxruntime's dynamic quantization (per channel)")
        quantize(fp32, staging / GRAPH)
        tool = "torch.onnx {torch} + onnxruntime.quantization quantize_dynamic {ort}"
    else:
        shutil.copy2(fp32, staging / GRAPH)
        tool = "torch.onnx {torch}"
    _tokenizer_files(layout, staging)
    config = EmbeddingConfig(
        name=source.name,
        dimensions=layout.dimensions,
        max_tokens=layout.max_tokens,
        pooling=layout.pooling,
        normalized=layout.normalize,
        precision=precision,
        pad_id=_pad_id(staging / "tokenizer.json"),
        lowercase=layout.lowercase,
        # Dynamic int8 scales a pass's activations by its whole range: one row a pass
        # keeps each text's vector the same in any batch (measured: 1.5e-2 apart otherwise).
        max_batch_rows=1 if precision == "int8" else EmbeddingConfig.max_batch_rows,
    )
    (staging / EMBEDDING_CONFIG).write_text(
        json.dumps(config.record(), indent=2) + "\n", encoding="utf-8"
    )
    manifest = Manifest(
        kind="embedding",
        model_name=source.name,
        source=str(source.folder) if source.kind in ("local-hf", "onnx") else source.spec,
        source_kind=source.kind,
        revision=source.revision,
        precision=precision,
        target=target.name,
        arch=target.arch,
        execution_provider="cpu",
        onnxruntime_genai_version=version("onnxruntime-genai"),
        builder_version=tool.format(torch=version("torch"), ort=version("onnxruntime")),
        files=list_files(staging),
    )
    write_manifest(staging, manifest)
    return manifest


def _smoke(folder: Path) -> str:
    """Embed one sentence with the baked folder and say what came out."""
    import numpy as np

    from ortserve.core.embedding import EmbeddingModel

    model = EmbeddingModel.load(folder)
    vector = model.embed(model.tokenize(["Hello"]))[0]
    line = (
        f"smoke test: 'Hello' -> a vector of {vector.shape[0]} floats, "
        f"norm {float(np.linalg.norm(vector)):.4f}"
    )
    say(line)
    return line

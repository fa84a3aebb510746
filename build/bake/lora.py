"""LoRA adapters served beside their base model (`ortserve bake --adapter NAME=PATH`).

onnxruntime-genai 0.18 switches adapters per generator (`og.Adapters`,
`Generator.set_active_adapter`): onnxruntime feeds an adapter file's tensors to the graph
inputs of the same names for that run. So the base graph gets, beside each projection of
each decoder layer the builder made (`/model/layers.N/attn/qkv_proj/MatMul…`, o_proj,
gate/up/down), a low-rank branch `x @ A @ B` added to its output, with A and B graph
inputs whose defaults have rank 0 (the base's answer, exactly: an empty product is zero).
An adapter is then a `.onnx_adapter` file (onnxruntime's `AdapterFormat`) holding its A
and B per site: PEFT's `lora_A` transposed, and `lora_B` transposed and scaled by
`lora_alpha / r` (√r with rsLoRA). The builder packs q, k and v into one MatMul: there, A
holds the three adapters' A side by side and B is block-diagonal.

The base weights are untouched (still the builder's, or a GGUF's exact import); the
adapters stay in fp32 (their low-rank products are where fine-tuning lives).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortserve.bake.errors import BakeError

if TYPE_CHECKING:
    import numpy as np

from ortserve.core.manifest import ADAPTER_NAME

# An adapter's name: served as `MODEL:NAME`, so no ':' or '/'; a file name too.
NAME_PATTERN = re.compile(ADAPTER_NAME)

# The builder's projection nodes, and the Hugging Face modules each one computes (in the
# order of its output features).
_SITE = re.compile(r"^/model/layers\.(\d+)/(attn|mlp)/(\w+)/MatMul[^/]*$")
_MODULES = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
_KNOWN = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# PEFT's tensor names: `...layers.N.self_attn.q_proj.lora_A.weight` (a prefix before).
_PEFT_KEY = re.compile(
    r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$"
)


@dataclass(frozen=True)
class Site:
    """One projection of the base graph where an adapter may add its low-rank branch.

    Attributes:
        layer: The decoder layer.
        name: The builder's name (qkv_proj, o_proj, gate_proj, ...).
        modules: The Hugging Face modules it computes, in the order of its outputs.
        sizes: Each module's output features.
        inputs: Input features.
    """

    layer: int
    name: str
    modules: tuple[str, ...]
    sizes: tuple[int, ...]
    inputs: int

    @property
    def a(self) -> str:
        """The graph input of the branch's first matrix, (inputs, rank)."""
        return f"lora.layers.{self.layer}.{self.name}.A"

    @property
    def b(self) -> str:
        """The graph input of its second, (rank, outputs)."""
        return f"lora.layers.{self.layer}.{self.name}.B"


@dataclass(frozen=True)
class AdapterSpec:
    """`--adapter NAME=PATH`: a PEFT LoRA adapter folder to bake beside the model."""

    name: str
    path: Path

    @classmethod
    def parse(cls, text: str) -> AdapterSpec:
        """`NAME=PATH`.

        Raises:
            BakeError: Not that form, a name that cannot be served, or no such folder.
        """
        name, sep, path = text.partition("=")
        if not sep or not name or not path:
            raise BakeError(f"--adapter {text!r}: expected NAME=PATH (a PEFT adapter folder)")
        if not NAME_PATTERN.match(name):
            raise BakeError(
                f"--adapter {name!r}: a name is letters, digits, '.', '_' and '-' (at most 64; "
                "it is served as MODEL:NAME)"
            )
        folder = Path(path).expanduser()
        if not (folder / "adapter_config.json").is_file():
            raise BakeError(
                f"--adapter {name}={path}: not a PEFT adapter folder (no adapter_config.json)"
            )
        return cls(name, folder.resolve())


def _sizes(site: str, outputs: int, model: dict[str, Any]) -> tuple[int, ...]:
    """Each module's output features in a packed site (q, k, v: from the heads)."""
    if site == "qkv_proj":
        decoder = model["decoder"]
        head = int(decoder["head_size"])
        q = int(decoder["num_attention_heads"]) * head
        kv = int(decoder["num_key_value_heads"]) * head
        return q, kv, kv
    if site == "gate_up_proj":
        return outputs // 2, outputs // 2
    return (outputs,)


def _io_type(graph: Any, node: Any) -> int:
    """The ONNX element type of the activations a projection node takes (its scales', for
    MatMulNBits: fp32 on CPU, fp16 on CUDA)."""
    from onnx import TensorProto

    initializers = {i.name: i for i in graph.initializer}
    for name in node.input[1:]:
        tensor = initializers.get(name)
        if tensor is not None and tensor.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16):
            return int(tensor.data_type)
    return int(TensorProto.FLOAT)


def _features(node: Any, graph: Any) -> tuple[int, int]:
    """(inputs, outputs) of a projection: MatMulNBits' K and N, or a MatMul's weight."""
    if node.op_type == "MatMulNBits":
        attrs = {a.name: a.i for a in node.attribute}
        return int(attrs["K"]), int(attrs["N"])
    for init in graph.initializer:
        if init.name == node.input[1]:
            return int(init.dims[0]), int(init.dims[1])
    raise BakeError(f"LoRA: cannot read the shape of {node.name}")


def adapted_modules(spec: AdapterSpec) -> set[str]:
    """The projections (q_proj, ...) an adapter adapts, from its tensors' names."""
    from safetensors import safe_open

    with safe_open(str(_weights(spec)), framework="numpy") as weights:
        keys = list(weights.keys())
    return {m.group(2) for key in keys if (m := _PEFT_KEY.search(key)) is not None}


def add_sites(folder: Path, modules: set[str]) -> tuple[list[Site], Any]:
    """Give the baked graph in `folder` its adapter inputs (see the module's text) where
    a projection computes one of `modules` (those the adapters adapt: a branch elsewhere
    would add nothing and cost its nodes a step); the sites, in graph order, and the
    numpy type of their tensors.

    Raises:
        BakeError: The graph has no projection the builder names (not a builder's graph).
    """
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from ortserve.bake.onnx_source import load_graph

    config = json.loads((folder / "genai_config.json").read_text(encoding="utf-8"))
    graph_file = folder / config["model"]["decoder"]["filename"]
    model = load_graph(graph_file)
    graph = model.graph
    sites: list[Site] = []
    nodes = []
    np_type: Any = np.float32
    for node in graph.node:
        nodes.append(node)
        match = _SITE.match(node.name)
        if match is None or node.op_type not in ("MatMulNBits", "MatMul"):
            continue
        layer, name = int(match.group(1)), match.group(3)
        computes = _MODULES.get(name, (name,))
        if not set(computes) <= set(_KNOWN) or not set(computes) & modules:
            continue
        inputs, outputs = _features(node, graph)
        site = Site(layer, name, computes, _sizes(name, outputs, config["model"]), inputs)
        if sum(site.sizes) != outputs:
            raise BakeError(f"LoRA: {node.name} has {outputs} outputs, not {sum(site.sizes)}")
        sites.append(site)
        dtype = _io_type(graph, node)
        np_type = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
        rank = f"lora_rank_{layer}_{name}"
        graph.input.extend(
            [
                helper.make_tensor_value_info(site.a, dtype, [inputs, rank]),
                helper.make_tensor_value_info(site.b, dtype, [rank, outputs]),
            ]
        )
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.zeros((inputs, 0), np_type), site.a),
                numpy_helper.from_array(np.zeros((0, outputs), np_type), site.b),
            ]
        )
        out = node.output[0]
        base = f"{out}/base"
        node.output[0] = base
        prefix = f"/model/layers.{layer}/{match.group(2)}/{name}/lora"
        nodes += [
            helper.make_node(
                "MatMul", [node.input[0], site.a], [f"{prefix}/A"], f"{prefix}/MatMul_A"
            ),
            helper.make_node(
                "MatMul", [f"{prefix}/A", site.b], [f"{prefix}/B"], f"{prefix}/MatMul_B"
            ),
            helper.make_node("Add", [base, f"{prefix}/B"], [out], f"{prefix}/Add"),
        ]
    if not sites:
        raise BakeError(
            "--adapter: the graph has no projections named as the model builder names them "
            "(an ONNX source's own graph cannot take adapters)"
        )
    del graph.node[:]
    graph.node.extend(nodes)
    _save_graph(model, graph_file)
    return sites, np_type


def _save_graph(model: Any, graph_file: Path) -> None:
    """Write the graph back, its weights staying in their external data file."""
    import onnx

    tmp = graph_file.with_name(f"{graph_file.name}.lora-tmp")
    onnx.save_model(model, str(tmp))  # external tensors keep their location
    tmp.replace(graph_file)


@dataclass(frozen=True)
class Converted:
    """An adapter's tensors for the graph's sites, and what it adapts."""

    tensors: dict[str, np.ndarray[Any, Any]]
    rank: int
    modules: tuple[str, ...]
    alpha: float


def _peft_config(spec: AdapterSpec) -> dict[str, Any]:
    """The adapter's config, refused where it is not a plain LoRA this graph can carry."""
    config: dict[str, Any] = json.loads(
        (spec.path / "adapter_config.json").read_text(encoding="utf-8")
    )
    where = f"--adapter {spec.name}"
    refusals = {
        "peft_type": (config.get("peft_type", "LORA") != "LORA", "only LoRA adapters"),
        "use_dora": (bool(config.get("use_dora")), "DoRA is not a low-rank sum"),
        "fan_in_fan_out": (bool(config.get("fan_in_fan_out")), "Conv1D layouts (GPT-2)"),
        "bias": (config.get("bias", "none") != "none", "adapters that train biases"),
        "lora_bias": (bool(config.get("lora_bias")), "adapters with a LoRA bias"),
        "modules_to_save": (bool(config.get("modules_to_save")), "fully trained modules"),
        "alpha_pattern": (bool(config.get("alpha_pattern")), "per-module alphas"),
    }
    for key, (refused, what) in refusals.items():
        if refused:
            raise BakeError(f"{where}: {key} is set: {what} cannot be served (plain LoRA only)")
    return config


def _weights(spec: AdapterSpec) -> Path:
    weights = spec.path / "adapter_model.safetensors"
    if not weights.is_file():
        raise BakeError(
            f"--adapter {spec.name}: no adapter_model.safetensors in {spec.path} (save it "
            "with PEFT's save_pretrained, safe_serialization on)"
        )
    return weights


def _peft_tensors(spec: AdapterSpec) -> dict[str, Any]:
    from safetensors.numpy import load_file

    return load_file(str(_weights(spec)))


def convert(spec: AdapterSpec, sites: list[Site]) -> Converted:
    """The adapter's A and B for each site it adapts (see the module's text).

    Raises:
        BakeError: It is not plain LoRA, adapts a module no site computes (embeddings, the
            LM head), or its shapes are not this model's.
    """
    import numpy as np

    config = _peft_config(spec)
    alpha = float(config.get("lora_alpha", 8))
    rslora = bool(config.get("use_rslora"))
    found: dict[tuple[int, str], dict[str, Any]] = {}
    for key, tensor in _peft_tensors(spec).items():
        match = _PEFT_KEY.search(key)
        if match is None or match.group(2) not in _KNOWN:
            raise BakeError(
                f"--adapter {spec.name}: it adapts {key.removesuffix('.weight')}: only the "
                f"attention and MLP projections ({', '.join(_KNOWN)}) can be served"
            )
        found.setdefault((int(match.group(1)), match.group(2)), {})[match.group(3)] = tensor
    by_module = {(s.layer, m): s for s in sites for m in s.modules}
    tensors: dict[str, Any] = {}
    ranks = set()
    for site in sites:
        parts = [found.get((site.layer, m)) for m in site.modules]
        if not any(parts):
            continue
        a_blocks, b_blocks = [], []
        for module, size, part in zip(site.modules, site.sizes, parts, strict=True):
            if part is None:
                continue
            lora_a, lora_b = part.get("A"), part.get("B")
            where = f"--adapter {spec.name}: layers.{site.layer}.{module}"
            if lora_a is None or lora_b is None:
                raise BakeError(f"{where}: lora_A or lora_B is missing")
            rank = int(lora_a.shape[0])
            if lora_a.shape != (rank, site.inputs) or lora_b.shape != (size, rank):
                raise BakeError(
                    f"{where}: lora_A {tuple(lora_a.shape)}, lora_B {tuple(lora_b.shape)} do "
                    f"not fit the model ({site.inputs} in, {size} out): an adapter of another "
                    "base model?"
                )
            ranks.add(rank)
            scale = alpha / (rank**0.5 if rslora else rank)
            a_blocks.append((module, lora_a.astype(np.float32).T))
            b_blocks.append((module, (lora_b.astype(np.float64) * scale).astype(np.float32).T))
        a = np.concatenate([blk for _, blk in a_blocks], axis=1)
        b = np.zeros((a.shape[1], sum(site.sizes)), np.float32)
        row, offsets = 0, dict(zip(site.modules, _offsets(site.sizes), strict=True))
        for module, blk in b_blocks:
            col = offsets[module]
            b[row : row + blk.shape[0], col : col + blk.shape[1]] = blk
            row += blk.shape[0]
        tensors[site.a], tensors[site.b] = np.ascontiguousarray(a), b
    missing = sorted(
        {f"layers.{k[0]}.{k[1]}" for k in found} - {f"layers.{k[0]}.{k[1]}" for k in by_module}
    )
    if missing:
        raise BakeError(f"--adapter {spec.name}: the model has no {missing[0]} (another model?)")
    if not tensors:
        raise BakeError(f"--adapter {spec.name}: it holds no LoRA weights")
    modules = tuple(m for m in _KNOWN if any(k[1] == m for k in found))
    return Converted(tensors, max(ranks), modules, alpha)


def _offsets(sizes: tuple[int, ...]) -> list[int]:
    out, at = [], 0
    for size in sizes:
        out.append(at)
        at += size
    return out


def write_adapter(tensors: dict[str, Any], path: Path, io_type: Any) -> None:
    """Write `tensors` as an onnxruntime adapter file (`AdapterFormat`), in `io_type`."""
    import onnxruntime as ort

    adapter = ort.AdapterFormat()
    adapter.set_adapter_version(1)
    adapter.set_model_version(1)
    # An OrtValue made from a numpy array points at its memory: the arrays must outlive
    # the export (a temporary's freed memory would be written out).
    arrays = {name: value.astype(io_type) for name, value in tensors.items()}
    adapter.set_parameters(
        {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in arrays.items()}
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    adapter.export_adapter(str(path))

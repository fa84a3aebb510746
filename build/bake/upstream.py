"""Work-arounds for the onnxruntime-genai 0.18 model builder, in one place.

Gemma 3 (transformers 5 configs): the builder reads a flat `rope_parameters["rope_type"]`,
`rope_theta` and `rope_local_base_freq`, but transformers 5 writes (and reads older
configs into) one nested entry per attention kind, so the builder fails with
`KeyError: 'rope_type'`. The builder is given a copy of the folder whose config.json also
has the flat keys (transformers still reads the nested ones). Its windowed KV cache on CPU
fails any generation shorter than the sliding window ("KV cache capacity (40) must be at
least local_window_size (512)"), so Gemma 3 is baked with `windowed_kv_cache=false`.
Linear RoPE scaling (Gemma 3 4B and larger) is refused: the builder scales the local
attention's rotary cache too, which makes wrong output without an error.

Quantization memory: `python -m bake.upstream ARGS` is `python -m
onnxruntime_genai.models.builder ARGS` (what the bake runs) with `Model.to_nbits`
replaced. og 0.18's turns the whole graph into one ModelProto (`ir.to_proto`: every
weight materialized in fp32, 4 bytes a parameter on top of the checkpoint the builder
holds), quantizes that copy with onnxruntime's `MatMulNBitsQuantizer`, and converts the
result back (`ir.from_proto`: another copy): a 1.7B checkpoint peaked at 14.2 GiB, a 3-4B
one does not fit 24 GB. Here each quantizable node is cut out into a one-node model,
quantized by the same `MatMulNBitsQuantizer` with the same algorithm, block size,
accuracy level and per-node bits (the recipe's overrides, og's presets), and spliced
back, the quantized tensors copied out of the one-node model (which still holds the fp32
weight); that weight goes at once. The bytes written are the builder's own
(tests/functional/test_bake_recipes.py compares them); the memory is the checkpoint, the
quantized weights and one weight's transient (Qwen3-1.7B: 14.2 -> 10.0 GiB). QDQ output
and pre-quantized checkpoints keep og's own `to_nbits`.

`prune_lm_head` (the logits of each pass's last position only, a CPU target's default:
bake.targets): og 0.18's builder takes position -1 of every row, a pad for a batch's
shorter, right-padded prompts; here each row's own last position is taken
(`_last_row_gather`).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortserve.bake.errors import BakeError, say

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

# What the bake runs: og's builder with the streaming `to_nbits` below.
BUILDER_MODULE = "ortserve.bake.upstream"
# Our own option of that command line (taken out before og's builder reads it): the
# checkpoint whose fp32 vectors replace a bf16 input's (`bf16_weights`).
FP32_FROM = "--ortserve-fp32-from"

_GEMMA3 = ("gemma3_text", "gemma3")


def _flat_gemma3_rope(text_config: dict[str, Any]) -> dict[str, Any]:
    """`rope_parameters` with the builder's flat keys beside transformers' nested ones."""
    rope = dict(text_config.get("rope_parameters") or {})
    if not rope:  # transformers 4.x keys
        full = {"rope_type": "default", "rope_theta": text_config.get("rope_theta", 1e6)}
        full.update(text_config.get("rope_scaling") or {})
        full.pop("type", None)
        local = text_config.get("rope_local_base_freq", 1e4)
        rope = {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": local},
        }
    full = rope.get("full_attention", rope)
    if full.get("rope_type", "default") != "default":
        raise BakeError(
            f"Gemma 3 with {full.get('rope_type')} RoPE scaling cannot be baked with "
            "onnxruntime-genai 0.18's builder: it scales the local attention's rotary cache "
            "too, which gives wrong output (Gemma 3 1B and smaller use none)"
        )
    if "rope_type" not in rope:
        rope.update(full)
        rope["rope_local_base_freq"] = rope.get("sliding_attention", {}).get("rope_theta", 1e4)
    return rope


def builder_input(
    src: Path, work: Path, options: dict[str, str], bf16: bool = False
) -> tuple[Path, dict[str, str]]:
    """The folder and options to give the builder for checkpoint `src`: `src` itself, or a
    copy under `work` (links to the rest) with config.json fixed where needed and, with
    `bf16`, the matrices in bf16 (`bf16_weights`).

    Raises:
        BakeError: A model the builder is known to bake wrong.
    """
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    gemma3 = config.get("model_type") in _GEMMA3
    if not gemma3 and not bf16:
        return src, options
    work.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        weights = path.suffix == ".safetensors" or path.name.endswith(".safetensors.index.json")
        if path.name != "config.json" and not (bf16 and weights):
            (work / path.name).symlink_to(path.resolve())
    if bf16:
        bf16_weights(src, work)
        say("builder input: the matrices in bf16 (the GGUF's own replace them), vectors fp32")
        config["dtype"] = "bfloat16"
        config.pop("torch_dtype", None)
    if gemma3:
        text = config.get("text_config", config) if config["model_type"] == "gemma3" else config
        text["rope_parameters"] = _flat_gemma3_rope(text)
        say(
            "Gemma 3: flat RoPE keys added for the builder, windowed_kv_cache=false "
            "(docs/troubleshooting.md)"
        )
        options = {"windowed_kv_cache": "false", **options}
    (work / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return work, options


# fp32 values converted at a time by `bf16_weights` (64 MiB of them).
_CHUNK_VALUES = 1 << 24


def bf16_weights(src: Path, out: Path) -> None:
    """Write `src`'s safetensors (and index) to `out` with every fp32 matrix in bf16:
    the builder's input for a GGUF whose matrices the exact import replaces (its fp32
    copy of a 1.5B checkpoint is 6 GB of the builder's memory). Vectors (norms, biases)
    are written as they are; the builder takes them from `src` in fp32
    (`--ortserve-fp32-from`). Streamed a chunk at a time with plain reads, as
    safetensors lays a file out (an 8-byte header size, a JSON header, the data), rounding
    to nearest even as torch does: loading a shard to convert it took 10 GiB at 1.5B."""
    import struct

    import numpy as np

    index = src / "model.safetensors.index.json"
    shards = (
        sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        if index.is_file()
        else ["model.safetensors"]
    )
    if index.is_file():
        (out / index.name).write_bytes(index.read_bytes())
    for shard in shards:
        with (src / shard).open("rb") as f, (out / shard).open("wb") as g:
            (size,) = struct.unpack("<Q", f.read(8))
            header: dict[str, Any] = json.loads(f.read(size))
            start = 8 + size
            entries = sorted(
                ((k, v) for k, v in header.items() if k != "__metadata__"),
                key=lambda item: int(item[1]["data_offsets"][0]),
            )
            layout: dict[str, Any] = {"__metadata__": header.get("__metadata__", {})}
            plan, offset = [], 0
            for name, info in entries:
                begin, end = (int(x) for x in info["data_offsets"])
                wide = info["dtype"] == "F32" and len(info["shape"]) >= 2
                length = (end - begin) // 2 if wide else end - begin
                layout[name] = {
                    "dtype": "BF16" if wide else info["dtype"],
                    "shape": info["shape"],
                    "data_offsets": [offset, offset + length],
                }
                plan.append((begin, end, wide))
                offset += length
            text = json.dumps(layout, separators=(",", ":")).encode()
            text += b" " * (-len(text) % 8)
            g.write(struct.pack("<Q", len(text)) + text)
            for begin, end, wide in plan:
                f.seek(start + begin)
                step = _CHUNK_VALUES * 4
                for at in range(begin, end, step):
                    raw = f.read(min(step, end - at))
                    if wide:
                        bits = np.frombuffer(raw, dtype="<u4")
                        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
                        raw = rounded.astype("<u2").tobytes()
                    g.write(raw)


def _restore_vectors(model: Any, folder: Path) -> None:
    """Put `folder`'s fp32 vectors (norm weights, biases) into `model` (loaded from
    `bf16_weights`' copy), so that the builder writes them exactly."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    where: dict[str, str] = (
        json.loads(index.read_text(encoding="utf-8"))["weight_map"] if index.is_file() else {}
    )
    vectors: dict[str, list[tuple[str, Any]]] = {}  # shard → (name, tensor)
    for name, tensor in model.state_dict(keep_vars=True).items():
        if tensor.dim() <= 1 and tensor.is_floating_point():
            vectors.setdefault(where.get(name, "model.safetensors"), []).append((name, tensor))
    for shard, wanted in vectors.items():
        with safe_open(str(folder / shard), framework="pt") as f:
            held = set(f.keys())
            for name, tensor in wanted:
                if name in held:
                    tensor.data = f.get_tensor(name)


_UPSTREAM = "onnxruntime_genai.models.builder"


def _one_node_model(node: ir.Node, weight_index: int, opsets: dict[str, int]) -> onnx.ModelProto:
    """`node` alone, its weight as the only initializer (materialized here, in fp32)."""
    import onnx
    import onnx_ir as ir

    inputs, initializers = [], []
    for index, value in enumerate(node.inputs):
        if value is None:
            continue
        if index == weight_index:
            assert value.const_value is not None
            tensor = ir.serde.serialize_tensor(value.const_value)
            tensor.name = value.name or ""
            initializers.append(tensor)
        else:
            dtype = value.dtype.value if value.dtype is not None else onnx.TensorProto.FLOAT
            inputs.append(onnx.helper.make_tensor_value_info(value.name or "", dtype, None))
    outputs = [
        onnx.helper.make_tensor_value_info(
            out.name or "",
            out.dtype.value if out.dtype is not None else onnx.TensorProto.FLOAT,
            None,
        )
        for out in node.outputs
    ]
    graph = onnx.helper.make_graph(
        [ir.serde.serialize_node(node)], "one_node", inputs, outputs, initializers
    )
    return onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()]
    )


def _splice(
    graph: ir.Graph, node: ir.Node, quantized: onnx.ModelProto, values: dict[str, ir.Value]
) -> None:
    """Replace `node` in `graph` by the nodes of `quantized` (its one-node model, quantized).

    `values` is the builder's name → value table: a name the builder already refers to
    (a tied embedding's GatherBlockQuantized names the lm_head's quantized weights before
    they exist) becomes that value, so the graph holds one value per name.
    """
    import onnx_ir as ir

    small = ir.from_proto(quantized)
    outer = {v.name: v for v in node.inputs if v is not None}
    mapped: dict[int, ir.Value] = {}
    for name, value in small.graph.initializers.items():
        fresh = values.get(name) or ir.Value(name=name)
        assert value.const_value is not None
        # A copy of its own: the proto's tensors would keep the whole one-node model alive,
        # its fp32 weight included (the quantizer leaves it there).
        data = value.const_value.numpy().copy()
        tensor = ir.Tensor(data, dtype=value.const_value.dtype, name=name)
        fresh.type, fresh.shape, fresh.const_value = value.type, value.shape, tensor
        graph.register_initializer(fresh)
        mapped[id(value)] = values.setdefault(name, fresh)
    for value in small.graph.inputs:
        mapped[id(value)] = outer[value.name]
    fresh_nodes = []
    for qnode in small.graph:
        made = ir.Node(
            qnode.domain,
            qnode.op_type,
            [mapped[id(v)] if v is not None else None for v in qnode.inputs],
            attributes=list(qnode.attributes.values()),
            num_outputs=len(qnode.outputs),
            name=qnode.name,
        )
        for old, new in zip(qnode.outputs, made.outputs, strict=True):
            new.type, new.shape = old.type, old.shape
            mapped[id(old)] = new
        fresh_nodes.append(made)
    graph.insert_after(node, fresh_nodes)
    weights = [v for v in node.inputs if v is not None and v.const_value is not None]
    outputs = [
        (old, mapped[id(new)]) for old, new in zip(node.outputs, small.graph.outputs, strict=True)
    ]
    for old, new in outputs:
        ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    graph.remove(node, safe=True)
    for old, new in outputs:
        new.name = old.name
        if old.name in values:
            values[old.name] = new
    for weight in weights:
        if weight.name and not weight.uses() and weight.name in graph.initializers:
            del graph.initializers[weight.name]
            values.pop(weight.name, None)


def _values(weight: ir.Value | None) -> int:
    """How many values a weight (a constant: `_weight_index`) holds."""
    assert weight is not None and weight.const_value is not None
    return math.prod(weight.const_value.shape.numpy())


def _weight_index(node: ir.Node) -> int | None:
    """Where `node`'s constant 2-D weight is among its inputs (None: it has none)."""
    index = 0 if node.op_type == "Gather" else 1
    weight = node.inputs[index] if len(node.inputs) > index else None
    if weight is None or weight.const_value is None or len(weight.shape or ()) != 2:
        return None
    return index


@contextlib.contextmanager
def _quiet(*loggers: str) -> Iterator[None]:
    """Only warnings and errors from `loggers` (and the loggers under them) meanwhile."""
    import logging

    saved = [(logging.getLogger(name), logging.getLogger(name).level) for name in loggers]
    for logger, _ in saved:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)


def to_nbits_streaming(self: Any, upstream: Any) -> ir.Model:
    """og's `Model.to_nbits`, one node at a time (see the module's docstring)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    from onnxruntime.quantization.quant_utils import QuantFormat

    attrs = self.quant_attrs
    if attrs["use_qdq"] or self.quant_type is not None:
        whole: ir.Model = upstream(self)
        return whole
    graph: ir.Graph = self.model.graph
    op_types = attrs["op_types_to_quantize"]
    excluded = set(attrs["nodes_to_exclude"])
    custom: dict[str, dict[str, int]] = getattr(self, "int4_customized_weight_config", {}) or {}
    method = getattr(self, "quantization_algo", "default")
    opsets = dict(self.model.opset_imports)
    eligible = {n.name for n in graph if n.op_type in op_types}
    # og checks the recipe's exact node names (its presets may name nodes it did not emit)
    unknown = sorted(getattr(self, "exact_quant_override_names", set()) - eligible)
    if unknown:
        raise ValueError(
            "exact quantization override(s) matched no quantizable node: " + ", ".join(unknown)
        )
    todo = [
        (node, index)
        for node in graph
        if node.op_type in op_types
        and node.name not in excluded
        and (index := _weight_index(node)) is not None
    ]
    # Each weight's values: a weight's time follows its size (Qwen2.5-Coder-0.5B's LM head,
    # the last of 121 weights, is 28% of the values and took 43% of the time), so the
    # progress line counts values toward its estimate, not weights.
    sizes = [_values(node.inputs[i]) for node, i in todo]
    total, values = sum(sizes), 0
    for done, (node, weight_index) in enumerate(todo, 1):
        bits = custom.get(node.name or "", {}).get("bits", attrs["bits"])
        algo = None
        if method != "default":
            algo = self.make_algo_config(method, {node.name: {"bits": bits}})
        quantizer = MatMulNBitsQuantizer(
            model=_one_node_model(node, weight_index, opsets),
            bits=bits,
            block_size=attrs["matmul_block_size"],
            is_symmetric=attrs["is_symmetric"],
            accuracy_level=attrs["accuracy_level"],
            nodes_to_exclude=[],
            quant_format=QuantFormat.QOperator,
            op_types_to_quantize=op_types,
            algo_config=algo,
        )
        # Each one-node run would print its own "Progress: 100%" and log "start to
        # quantize": one line per weight instead (bake.progress reads it).
        with contextlib.redirect_stdout(io.StringIO()), _quiet("onnxruntime", "neural_compressor"):
            quantizer.process()
        values += sizes[done - 1]
        print(
            f"Quantizing weight {done}/{len(todo)} {node.name} int{bits} (values {values}/{total})",
            flush=True,
        )
        quantized = quantizer.model.model
        self.prepack_matmulnbits_weights(quantized)
        _splice(graph, node, quantized, self.values)
    model: ir.Model = self.model
    return model


def _last_row_gather(self: Any, name: str, hidden: str, dtype: Any, shape: list[Any]) -> None:
    """`prune_lm_head`'s hidden-state pick, per row: the last position of this pass that
    the row's attention mask counts, where og 0.18's builder takes position -1 of every
    row. A batch's shorter prompts are right-padded (core.engine), so -1 was a pad for them
    and their first token came from the pad's logits ("lik lik lik..."). Index of row b:
    sum(mask[b]) - (mask length - S) - 1, clipped to 0..S-1 (a padded row's decode steps
    give 0, its one token); GatherND with batch_dims=1 takes it; output [B, H] as before.
    """
    mask, ids = self.input_names["attention_mask"], self.input_names["input_ids"]
    one, zero = "/model/constants/INT64/1", "/model/constants/INT64/0"
    nodes = [
        ("ReduceSum", [mask, "/model/constants/INT64/[1]"], "mask_sum", {"keepdims": 1}),
        ("Shape", [mask], "mask_shape", {}),
        ("Gather", ["mask_shape", one], "mask_len", {"axis": 0}),
        ("Shape", [ids], "ids_shape", {}),
        ("Gather", ["ids_shape", one], "seq_len", {"axis": 0}),
        ("Sub", ["mask_len", "seq_len"], "past", {}),
        ("Sub", ["mask_sum", "past"], "valid", {}),
        ("Sub", ["valid", one], "last", {}),
        ("Max", ["last", zero], "at_least_0", {}),
        ("Sub", ["seq_len", one], "final", {}),
        ("Min", ["at_least_0", "final"], "index", {}),
    ]
    import onnx_ir as ir

    for op, inputs, out, attrs in nodes:
        full = [i if i.startswith(("/model/", mask, ids)) else f"{name}/{i}" for i in inputs]
        self.make_node(op, inputs=full, outputs=[f"{name}/{out}"], name=f"{name}/{out}", **attrs)
        self.make_value(f"{name}/{out}", ir.DataType.INT64, shape=None)
    output = f"{name}/output_0"
    self.make_node(
        "GatherND",
        inputs=[hidden, f"{name}/index"],
        outputs=[output],
        name=name,
        batch_dims=1,
    )
    self.make_value(output, dtype, shape=shape)


def main() -> None:
    """Run og's builder (its command line) with the streaming `to_nbits` and a per-row
    `prune_lm_head`."""
    import onnxruntime_genai.models  # noqa: F401  (puts og's `builders` on sys.path)
    from builders.base import Model  # type: ignore[import-not-found]

    upstream = Model.to_nbits
    Model.to_nbits = lambda self: to_nbits_streaming(self, upstream)
    if FP32_FROM in sys.argv:
        at = sys.argv.index(FP32_FROM)
        vectors = Path(sys.argv[at + 1])
        del sys.argv[at : at + 2]
        load = Model.load_weights

        def load_weights(self: Any, input_path: str) -> Any:
            model = load(self, input_path)
            _restore_vectors(model, vectors)
            return model

        Model.load_weights = load_weights
    gather = Model.make_gather

    def make_gather(
        self: Any, name: str, inputs: list[str], dtype: Any, shape: Any, axis: int
    ) -> None:
        pruning = name.endswith("/prune/Gather") and not getattr(self, "use_paged_attention", False)
        if pruning and {"attention_mask", "input_ids"} <= set(self.input_names):
            _last_row_gather(self, name, inputs[0], dtype, shape)
        else:
            gather(self, name, inputs, dtype, shape, axis)

    Model.make_gather = make_gather
    sys.argv[0] = _UPSTREAM
    runpy.run_module(_UPSTREAM, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

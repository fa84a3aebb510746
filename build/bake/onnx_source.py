"""ONNX sources: which graph of an export to bake, what precision it holds, and how it is
copied (or quantized from fp32) into the baked folder.

onnx-community repositories keep config.json and the tokenizer at the top and one graph
per precision under `onnx/` (`model.onnx` fp32, `model_fp16.onnx`, `model_q4.onnx`,
`model_q4f16.onnx`, `model_int8.onnx`, `model_uint8.onnx`, `model_quantized.onnx`,
`model_bnb4.onnx`), each with its weights in a `.onnx_data` / `.onnx.data` file beside it.
Only the chosen graph and its data are downloaded and copied.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ortserve.bake.errors import BakeError

if TYPE_CHECKING:
    import onnx

GRAPH_DIR = "onnx"
BAKED_GRAPH = "model.onnx"
BAKED_DATA = "model.onnx.data"

# The default when no --onnx-file is given, best first. On CPU: 4-bit weights with fp32
# activations (MatMulNBits has fast CPU kernels, and decode is memory-bound, so the
# smallest weights win), then 8-bit dynamic quantization, then 4-bit with fp16
# activations (onnxruntime's CPU EP runs them, but fp16 arithmetic is its slow path),
# then fp32, then fp16. On CUDA: fp16 first, its native precision.
_CPU_ORDER = (
    "model_q4.onnx",
    "model_int8.onnx",
    "model_quantized.onnx",
    "model_uint8.onnx",
    "model_q4f16.onnx",
    "model.onnx",
    "model_fp16.onnx",
)
_CUDA_ORDER = (
    "model_fp16.onnx",
    "model_q4f16.onnx",
    "model_q4.onnx",
    "model.onnx",
    "model_int8.onnx",
    "model_quantized.onnx",
    "model_uint8.onnx",
)
_KINDS = {
    "model_q4.onnx": "4-bit weights, fp32 activations",
    "model_q4f16.onnx": "4-bit weights, fp16 activations",
    "model_int8.onnx": "8-bit weights (dynamic quantization)",
    "model_uint8.onnx": "8-bit weights (dynamic quantization)",
    "model_quantized.onnx": "8-bit weights (dynamic quantization)",
    "model.onnx": "fp32",
    "model_fp16.onnx": "fp16",
}
# Operators that mean a graph's weights are already quantized, and to what.
_QUANTIZED_OPS = {
    "MatMulNBits": "int4",
    "GatherBlockQuantized": "int4",
    "MatMulBnb4": "int4 (bnb4)",
    "MatMulInteger": "int8",
    "DynamicQuantizeMatMul": "int8",
    "MatMulIntegerToFloat": "int8",
    "QLinearMatMul": "int8",
    "DequantizeLinear": "quantized (QDQ)",
}


@dataclass(frozen=True)
class Variant:
    """The graph of an ONNX source that the bake uses.

    Attributes:
        path: Its path relative to the source folder or repository (posix).
        reason: Why it was chosen, for the bake's output.
    """

    path: str
    reason: str


def graphs_in(files: Iterable[str]) -> list[str]:
    """The `.onnx` graphs among `files` (repo-relative posix paths): top level and `onnx/`."""
    return sorted(
        f
        for f in files
        if f.endswith(".onnx") and ("/" not in f or (f.count("/") == 1 and f.startswith("onnx/")))
    )


def local_graphs(folder: Path) -> list[str]:
    """The `.onnx` graphs of a local folder, as `graphs_in` sees them."""
    found = [p.name for p in folder.glob("*.onnx")]
    found += [f"{GRAPH_DIR}/{p.name}" for p in (folder / GRAPH_DIR).glob("*.onnx")]
    return graphs_in(p for p in found if (folder / p).is_file())


def data_patterns(graph: str) -> list[str]:
    """Download patterns for the external data files that usually sit beside `graph`."""
    return [f"{graph}_data*", f"{graph}.data*"]


def choose_variant(graphs: list[str], runtime_ep: str, requested: str | None) -> Variant:
    """Pick the graph to bake among `graphs` (see `graphs_in`).

    A requested path wins. A single graph is used. Several graphs at the top level are
    ambiguous: the user must choose. Several under `onnx/` follow the onnx-community names,
    best first for the target's execution provider (see `_CPU_ORDER`, `_CUDA_ORDER`).

    Raises:
        BakeError: The requested graph is not there, or no rule picks one.
    """
    if requested is not None:
        wanted = requested.strip().replace("\\", "/").removeprefix("./")
        if wanted not in graphs:
            have = ", ".join(graphs) or "no ONNX graph"
            raise BakeError(f"--onnx-file {requested}: no such graph in the source (it has {have})")
        return Variant(wanted, "chosen with --onnx-file")
    if len(graphs) == 1:
        return Variant(graphs[0], "the only graph")
    top = [g for g in graphs if "/" not in g]
    if not top:
        order = _CUDA_ORDER if runtime_ep == "cuda" else _CPU_ORDER
        for name in order:
            path = f"{GRAPH_DIR}/{name}"
            if path in graphs:
                rule = " > ".join(n.removesuffix(".onnx") for n in order)
                return Variant(path, f"{_KINDS[name]}: the first present of {rule} on {runtime_ep}")
    raise BakeError(
        f"the source has {len(graphs)} ONNX graphs ({', '.join(graphs)}): choose one with "
        "--onnx-file PATH (relative to the source)"
    )


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def _external(tensor: onnx.TensorProto) -> dict[str, str] | None:
    import onnx

    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    return {entry.key: entry.value for entry in tensor.external_data}


def load_graph(path: Path) -> onnx.ModelProto:
    """The graph without its weights.

    Raises:
        BakeError: Not a readable ONNX model.
    """
    import onnx

    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, ValueError...: all mean "unreadable"
        raise BakeError(f"{path.name} is not a readable ONNX model: {exc}") from exc


def save_graph(model: onnx.ModelProto, path: Path) -> None:
    """Write a graph edited in memory back to `path`, its weights to `path.name + .data`
    (the builder's layout), readable by all as the builder's files are."""
    import onnx

    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data.name,
        size_threshold=1024,
    )
    data.chmod(0o644)  # onnx writes it owner-only


def data_files(model: onnx.ModelProto) -> list[str]:
    """The external data files a graph refers to, by the names written inside it."""
    names = set()
    for tensor in _tensors(model.graph):
        info = _external(tensor)
        if info is not None and "location" in info:
            names.add(info["location"])
    return sorted(names)


def graph_precision(model: onnx.ModelProto) -> str:
    """What the graph's weights are: int4, int8, a quantized kind, fp16 or fp32."""
    import onnx

    nodes = [node for node in model.graph.node if node.op_type in _QUANTIZED_OPS]
    ops = {node.op_type: node for node in nodes}
    if "MatMulNBits" in ops:  # the weights that matter; embeddings may differ
        widths = sorted(
            {
                next((a.i for a in node.attribute if a.name == "bits"), 4)
                for node in nodes
                if node.op_type == "MatMulNBits"
            }
        )
        # A mixed-precision graph (e.g. k_quant_mixed: int8 lm_head and sensitive layers)
        # is named by its narrowest weights, which most MatMuls use.
        mixed = f" (with int{widths[-1]} layers)" if len(widths) > 1 else ""
        return f"int{widths[0]}{mixed}"
    for op, kind in _QUANTIZED_OPS.items():
        if op in ops:
            return kind
    floats = [
        tensor.data_type
        for tensor in model.graph.initializer
        if tensor.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    ]
    return "fp16" if floats and floats.count(onnx.TensorProto.FLOAT16) * 2 > len(floats) else "fp32"


def copy_graph(src: Path, dst_dir: Path, name: str) -> list[str]:
    """Copy graph `src` and its external data into `dst_dir`, the graph as `name`.

    Data files are referred to by name inside the graph: when the graph is renamed, a
    single data file is renamed to `name + ".data"` and the graph's references rewritten;
    several data files keep their names.

    Returns:
        The names of the data files written.

    Raises:
        BakeError: The graph refers to a data file that is not beside it.
    """
    import onnx

    model = load_graph(src)
    files = data_files(model)
    for file in files:
        if "/" in file or "\\" in file or not (src.parent / file).is_file():
            raise BakeError(f"{src.name} refers to external data {file!r}, not found beside it")
    dst_dir.mkdir(parents=True, exist_ok=True)
    if name == src.name or len(files) != 1:
        shutil.copy2(src, dst_dir / name)
        renamed = {file: file for file in files}
    else:
        renamed = {files[0]: f"{name}.data"}
        for tensor in _tensors(model.graph):
            for entry in tensor.external_data if _external(tensor) else ():
                if entry.key == "location":
                    entry.value = renamed[entry.value]
        onnx.save(model, str(dst_dir / name))
    for old, new in renamed.items():
        shutil.copy2(src.parent / old, dst_dir / new)
    return list(renamed.values())


def quantize_graph(
    src: Path, dst_dir: Path, name: str, bits: int, block_size: int, accuracy_level: int | None
) -> int:
    """Quantize an fp32 graph's MatMul weights to `bits` with onnxruntime's MatMulNBitsQuantizer.

    The result is written as `dst_dir/name` with its weights in `name + ".data"`.

    Returns:
        How many MatMul nodes were quantized.

    Raises:
        BakeError: Nothing in the graph could be quantized.
    """
    import logging

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    # It logs two INFO lines per MatMul; the bake says what it did in one.
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    model = onnx.load(str(src))  # with its weights, from beside it
    quantizer = MatMulNBitsQuantizer(
        model, bits=bits, block_size=block_size, is_symmetric=True, accuracy_level=accuracy_level
    )
    quantizer.process()
    quantized = sum(1 for node in quantizer.model.model.graph.node if node.op_type == "MatMulNBits")
    if not quantized:
        raise BakeError(f"{src.name}: no MatMul with constant weights to quantize")
    dst_dir.mkdir(parents=True, exist_ok=True)
    quantizer.model.save_model_to_file(str(dst_dir / name), use_external_data_format=True)
    return quantized

"""Exact GGUF import: the builder's graph with the GGUF's own quantized weights.

A GGUF source is first converted to an fp32 checkpoint (bake.gguf) and built by the
onnxruntime-genai builder like any checkpoint; this step then replaces the weights of
every MatMulNBits projection by the GGUF's blocks, bit for bit (bake.gguf_blocks), so
the baked model computes with the weights the GGUF's users run, not a second
quantization of them. A block format with an offset (Q4_1, Q4_K, Q5_1, Q5_K) keeps
an integer zero point and adds the rest as a side term: the input summed over each
32-block, times a small fp32 matrix [K/32, N], added to the product.

The token embedding is looked up in the GGUF's blocks too (GatherBlockQuantized: the
lm_head's own when tied, else `token_embd`'s; a format with offsets adds them from a
[vocab, K/32] table), never an fp32 copy. 8-bit blocks are stored with the kernels'
default zero point (bake.gguf_blocks.Blocks.centred).

Every replaced weight is first checked against the fp32 checkpoint (the GGUF
dequantized): a tensor that does not match (a layout this code does not know) or a
type that does not map (F16, IQ*, ...) keeps the builder's quantization (an embedding:
its fp32 Gather), and the record says which and why.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.bake.errors import BakeError, say
from ortserve.bake.gguf import CHECKPOINT_WEIGHTS
from ortserve.bake.gguf_blocks import MAPPED_TYPES, OFFSET_BLOCK, Array, Blocks, concat, decode
from ortserve.bake.onnx_source import save_graph

# og node name → (layer, projection); the lm_head has no layer.
_LAYER_NODE = re.compile(r"^/model/layers\.(\d+)/(?:attn|mlp)/(\w+)/MatMul")
_HEAD_NODE = re.compile(r"^/lm_head/MatMul")
# og projection → candidate lists of (GGUF tensor, checkpoint tensor, half) in the order
# og concatenates them; the first candidate whose tensors the GGUF and the checkpoint both
# hold applies. `half` takes the first (0) or second (1) half of both tensors' rows: Phi-3
# keeps gate and up in one tensor (GGUF `ffn_up`, checkpoint `gate_up_proj`, gate first)
# where og makes two MatMuls, and q, k, v in one (`attn_qkv`, `qkv_proj`).
_Candidate = list[tuple[str, str, int | None]]
_PROJECTIONS: dict[str, list[_Candidate]] = {
    "qkv_proj": [
        [
            ("attn_q", "self_attn.q_proj", None),
            ("attn_k", "self_attn.k_proj", None),
            ("attn_v", "self_attn.v_proj", None),
        ],
        [("attn_qkv", "self_attn.qkv_proj", None)],
    ],
    "q_proj": [[("attn_q", "self_attn.q_proj", None)]],
    "k_proj": [[("attn_k", "self_attn.k_proj", None)]],
    "v_proj": [[("attn_v", "self_attn.v_proj", None)]],
    "o_proj": [[("attn_output", "self_attn.o_proj", None)]],
    "gate_proj": [[("ffn_gate", "mlp.gate_proj", None)], [("ffn_up", "mlp.gate_up_proj", 0)]],
    "up_proj": [[("ffn_up", "mlp.up_proj", None)], [("ffn_up", "mlp.gate_up_proj", 1)]],
    "down_proj": [[("ffn_down", "mlp.down_proj", None)]],
}
# Heads whose rows llama.cpp's converter permutes (rotary halves interleaved), by the
# config field that counts them.
_PERMUTED = {"attn_q": "num_attention_heads", "attn_k": "num_key_value_heads"}


@dataclass
class ImportReport:
    """What the import did, for the manifest: GGUF tensor → its type, mapped or not."""

    exact: dict[str, str] = field(default_factory=dict)
    requantized: dict[str, str] = field(default_factory=dict)  # tensor → why
    compacted: dict[str, str] = field(default_factory=dict)  # tensor → its type


@dataclass
class _Part:
    gguf: str
    checkpoint: str
    half: int | None = None  # the first (0) or second (1) half of both tensors' rows


def _parts(node_name: str, tied: bool, has: Callable[[_Part], bool]) -> list[_Part] | None:
    """The GGUF and checkpoint tensors a MatMulNBits node computes with: the first
    candidate whose tensors `has` finds (None: the node is not known)."""
    if _HEAD_NODE.match(node_name):
        if tied:
            return [_Part("token_embd.weight", "model.embed_tokens.weight")]
        return [_Part("output.weight", "lm_head.weight")]
    found = _LAYER_NODE.match(node_name)
    if found is None or found.group(2) not in _PROJECTIONS:
        return None
    layer = found.group(1)
    candidates = [
        [
            _Part(f"blk.{layer}.{gguf}.weight", f"model.layers.{layer}.{hf}.weight", half)
            for gguf, hf, half in candidate
        ]
        for candidate in _PROJECTIONS[found.group(2)]
    ]
    return next((c for c in candidates if all(has(p) for p in c)), candidates[0])


def _llama_rows(rows: int, heads: int) -> Array:
    """llama.cpp's q/k row permutation (convert_hf_to_gguf's `permute`), as an index:
    GGUF row r holds checkpoint row order[r]."""
    index = np.arange(rows)
    return index.reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(rows)


# Rows compared at a time: a whole embedding's fp32 dequantization, its reference and
# their difference were three 933 MB arrays at Qwen2.5-1.5B (the import's peak memory).
_CHECK_ROWS = 4096


class _Rows:
    """A checkpoint tensor, or a range of its rows, read a few rows at a time."""

    def __init__(self, tensor: Any, start: int = 0, stop: int | None = None) -> None:
        shape = [int(n) for n in tensor.get_shape()]
        self._tensor, self._start = tensor, start
        self._stop = shape[0] if stop is None else stop
        self.shape = (self._stop - start, *shape[1:])

    def rows(self, first: int, last: int) -> Array:
        out: Array = self._tensor[self._start + first : self._start + last]
        return out

    def half(self, which: int) -> _Rows:
        size = self.shape[0] // 2
        return _Rows(self._tensor, self._start + which * size, self._start + (which + 1) * size)

    def chunks(self) -> Iterator[tuple[int, Array]]:
        for first in range(0, self.shape[0], _CHECK_ROWS):
            yield first, self.rows(first, min(first + _CHECK_ROWS, self.shape[0]))


def _matches(blocks: Blocks, reference: _Rows) -> bool:
    """Whether `blocks` dequantize to `reference` within 1e-5 of its largest magnitude."""
    if blocks.q.shape != reference.shape:
        return False
    largest = worst = 0.0
    for first, want in reference.chunks():
        got = blocks.take_rows(np.arange(first, first + want.shape[0])).dequantize()
        largest = max(largest, float(np.abs(want).max()))
        worst = max(worst, float(np.abs(got - want).max()))
    return worst <= 1e-5 * (largest or 1.0)


class _Source:
    """The GGUF's tensors and the checkpoint's, read one at a time."""

    def __init__(self, gguf: Path, checkpoint: Path) -> None:
        import json

        from gguf import GGUFReader
        from safetensors import safe_open

        self.tensors = {t.name: t for t in GGUFReader(gguf).tensors}
        self.config: dict[str, Any] = json.loads(
            (checkpoint / "config.json").read_text(encoding="utf-8")
        )
        single, index = (checkpoint / name for name in CHECKPOINT_WEIGHTS)
        files = (
            sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            if index.is_file()
            else [single.name]
        )
        # Tensor name → the shard that holds it. A shard is opened for each tensor read and
        # closed with it: an open file's pages read through its mapping stay resident.
        self._files: dict[str, Path] = {}
        for file in files:
            with safe_open(str(checkpoint / file), framework="np") as shard:
                keys: list[str] = shard.keys()
            self._files |= dict.fromkeys(keys, checkpoint / file)
        self.names: set[str] = set(self._files)

    def has(self, part: _Part) -> bool:
        """Whether the GGUF and the checkpoint both hold the part's tensors."""
        return part.gguf in self.tensors and part.checkpoint in self.names

    def reference(self, name: str) -> _Rows | None:
        from safetensors import safe_open

        if name not in self.names:
            return None
        shard = safe_open(str(self._files[name]), framework="np")
        return _Rows(shard.get_slice(name))  # type: ignore[no-untyped-call]

    def blocks(self, part: _Part) -> Blocks | str:
        """The part's blocks, checked against the checkpoint, or why they cannot be used."""
        tensor = self.tensors.get(part.gguf)
        if tensor is None:
            return "not in the GGUF"
        kind = tensor.tensor_type.name
        if kind not in MAPPED_TYPES:
            return f"{kind} has no exact MatMulNBits form"
        reference = self.reference(part.checkpoint)
        if reference is None:
            return f"the checkpoint has no {part.checkpoint}"
        blocks = decode(kind, np.asarray(tensor.data), int(tensor.shape[0]))
        if part.half is not None:
            rows = blocks.rows // 2
            blocks = blocks.take_rows(np.arange(rows) + part.half * rows)
            reference = reference.half(part.half)
        if _matches(blocks, reference):
            return blocks
        heads = self.config.get(_PERMUTED.get(part.gguf.split(".")[-2], ""))
        if isinstance(heads, int) and blocks.rows % (2 * heads) == 0:
            unpermuted = blocks.take_rows(np.argsort(_llama_rows(blocks.rows, heads)))
            if _matches(unpermuted, reference):
                return unpermuted
        return f"its {kind} weights do not match the checkpoint's {part.checkpoint}"


def _pack(blocks: Blocks) -> tuple[Array, Array, Array]:
    """MatMulNBits's B [N, K/block, block·bits/8], scales [N, K/block] and zero points."""
    n, k = blocks.q.shape
    per = blocks.q.reshape(n, k // blocks.block, blocks.block)
    if blocks.bits == 8:
        return per, blocks.scale.astype(np.float32), blocks.zero.astype(np.uint8)
    pairs = per.reshape(n, k // blocks.block, blocks.block // 2, 2)
    packed = (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)
    zero = blocks.zero
    if zero.shape[1] % 2:
        zero = np.concatenate([zero, np.full((n, 1), 8, np.uint8)], axis=1)
    zero_pairs = zero.reshape(n, -1, 2)
    zeros = (zero_pairs[..., 0] | (zero_pairs[..., 1] << 4)).astype(np.uint8)
    return packed, blocks.scale.astype(np.float32), zeros


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _set_attr(node: Any, name: str, value: int) -> None:
    for attr in node.attribute:
        if attr.name == name:
            attr.i = value
            return
    raise BakeError(f"{node.name} has no attribute {name}")


class _Graph:
    """The baked graph, its initializers by name and the edits to it."""

    def __init__(self, path: Path) -> None:
        import onnx

        self.path = path
        # Without the weights: those the import replaces are never read (at Qwen2.5-Coder-
        # 1.5B the builder's 1.5 GB of matrices), the rest only when saving.
        self.model = onnx.load(str(path), load_external_data=False)
        self.graph = self.model.graph
        self.inits = {i.name: i for i in self.graph.initializer}
        # Nodes to add after (or, for block sums, before) a node, by its name.
        self.before: dict[str, list[Any]] = {}
        self.after: dict[str, list[Any]] = {}
        self._sums: dict[str, str] = {}
        self._removed: set[str] = set()

    def put(self, name: str, array: Array) -> None:
        from onnx import numpy_helper

        tensor = numpy_helper.from_array(np.ascontiguousarray(array), name)
        old = self.inits.get(name)
        if old is not None:
            self.graph.initializer.remove(old)
        self.graph.initializer.append(tensor)
        self.inits[name] = tensor

    def drop_unused(self, name: str) -> None:
        """Remove initializer `name` if no node reads it any more."""
        if name in self.inits and not any(name in n.input for n in self.graph.node):
            self.graph.initializer.remove(self.inits.pop(name))

    def reshape_data(self, gather: Any, shape: list[int]) -> None:
        """Point the Reshape that feeds `gather` its data (the lm_head's weight viewed as
        rows) at `shape`: the packed row is K·bits/8 bytes."""
        producer = next((n for n in self.graph.node if gather.input[0] in n.output), None)
        if producer is None or producer.op_type != "Reshape":
            raise BakeError(f"{gather.name}: its data does not come from a Reshape")
        name, old = f"{gather.name}/ortserve_data_shape", producer.input[1]
        self.put(name, np.array(shape, dtype=np.int64))
        producer.input[1] = name
        self.drop_unused(old)

    def gathers_sharing(self, scale: str) -> list[Any]:
        return [
            n for n in self.graph.node if n.op_type == "GatherBlockQuantized" and scale in n.input
        ]

    def block_sum(self, node: Any, columns: int) -> str:
        """The node's input summed over each 32-block (made once per input): one MatMul
        with a 0/1 matrix [K, K/32] (one op where Reshape + ReduceSum are two: at one token
        per step the side terms' cost is their ops' dispatch)."""
        from onnx import helper

        source = node.input[0]
        if source in self._sums:
            return self._sums[source]
        base = f"{source}/ortserve_blocksum"
        ones = self.block_ones(columns, transposed=False)
        self.before.setdefault(node.name, []).append(
            helper.make_node("MatMul", [source, ones], [base], f"{base}/MatMul")
        )
        self._sums[source] = base
        return base

    def block_ones(self, columns: int, transposed: bool) -> str:
        """The 0/1 matrix [K, K/32] that sums 32-blocks (or, transposed, [K/32, K] that
        repeats each of K/32 values 32 times), one initializer per K for the whole graph."""
        name = f"ortserve_block_ones/{columns}" + ("/T" if transposed else "")
        if name not in self.inits:
            ones = np.kron(
                np.eye(columns // OFFSET_BLOCK, dtype=np.float32),
                np.ones((OFFSET_BLOCK, 1), np.float32),
            )
            self.put(name, ones.T if transposed else ones)
        return name

    def add_gather_offset(self, after: str, out: str, ids: str, offset: Array) -> None:
        """Make `out` (an embedding lookup by `ids`, added after node `after`) its value +
        offset[token] repeated over each 32-block: a Gather from a [vocab, K/32] table,
        a MatMul with a [K/32, K] 0/1 matrix, an Add."""
        from onnx import helper

        base = f"{out}/ortserve_offset"
        main, table = f"{base}/quantized", f"{base}/table"
        self.put(table, offset.astype(np.float32))
        ones = self.block_ones(offset.shape[1] * OFFSET_BLOCK, transposed=True)
        producer = next(
            n for n in [*self.after.get(after, []), *self.graph.node] if out in n.output
        )
        producer.output[list(producer.output).index(out)] = main
        self.after.setdefault(after, []).extend(
            [
                helper.make_node("Gather", [table, ids], [f"{base}/gathered"], f"{base}/Gather"),
                helper.make_node(
                    "MatMul", [f"{base}/gathered", ones], [f"{base}/full"], f"{base}/MatMul"
                ),
                helper.make_node("Add", [main, f"{base}/full"], [out], f"{base}/Add"),
            ]
        )

    def add_offset(self, node: Any, offset: Array, columns: int) -> None:
        """out = MatMulNBits(x) + blocksum(x) @ offsetᵀ."""
        from onnx import helper

        sums = self.block_sum(node, columns)
        out = node.output[0]
        main, side, weight = f"{out}/ortserve_main", f"{out}/ortserve_offset", f"{out}/offsets"
        self.put(weight, offset.T.astype(np.float32))
        node.output[0] = main
        self.after.setdefault(node.name, []).extend(
            [
                helper.make_node("MatMul", [sums, weight], [side], f"{node.name}/offset/MatMul"),
                helper.make_node("Add", [main, side], [out], f"{node.name}/offset/Add"),
            ]
        )

    def remove(self, node: Any) -> None:
        """Drop `node` when saving (what `after` adds for it stays), and its initializers
        no other node reads."""
        self._removed.add(node.name)

    def save(self) -> None:
        nodes = []
        for node in self.graph.node:
            kept = [] if node.name in self._removed else [node]
            nodes += [*self.before.get(node.name, []), *kept, *self.after.get(node.name, [])]
        dropped = [i for n in self.graph.node if n.name in self._removed for i in n.input]
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        for name in dropped:
            self.drop_unused(name)
        from onnx.external_data_helper import load_external_data_for_model

        # The kept weights, read from the builder's data file before it is written anew.
        load_external_data_for_model(self.model, str(self.path.parent))
        save_graph(self.model, self.path)


def _set_zero_points(node: Any, name: str) -> None:
    """Make input 3 (zero points) `name` ("": none), keeping any later input (MatMulNBits's
    g_idx and bias)."""
    inputs = list(node.input) + [""] * max(0, 4 - len(node.input))
    inputs[3] = name
    while inputs and not inputs[-1]:
        inputs.pop()
    del node.input[:]
    node.input.extend(inputs)


def _replace(graph: _Graph, node: Any, blocks: Blocks) -> str | None:
    """Put `blocks` in `node`'s place (None), or say why they cannot go there."""
    attrs = _attrs(node)
    n, k = blocks.q.shape
    if (attrs.get("N"), attrs.get("K")) != (n, k):
        return f"the graph's {node.name} is {attrs.get('N')}x{attrs.get('K')}, not {n}x{k}"
    gathers = graph.gathers_sharing(node.input[2])
    blocks = blocks.centred()
    weight, scale, zero = _pack(blocks)
    old_zero = node.input[3] if len(node.input) > 3 else ""
    graph.put(node.input[1], weight)
    graph.put(node.input[2], scale)
    # The kernels' default zero point is 2**(bits-1) (8 or 128, GatherBlockQuantized's
    # too): left out when every block has it (Q4_0, Q4_1, Q4_K, Q8_0), as llama.cpp
    # stores nothing for it either.
    users = [node, *gathers]
    if blocks.default_zero:
        for user in users:
            _set_zero_points(user, "")
        graph.drop_unused(old_zero)
    else:
        name = old_zero or f"{node.input[1]}/zero_points"
        for user in users:
            _set_zero_points(user, name)
        graph.put(name, zero)
    _set_attr(node, "bits", blocks.bits)
    _set_attr(node, "block_size", blocks.block)
    for gather in gathers:
        _set_attr(gather, "block_size", blocks.block)
        _set_attr(gather, "bits", blocks.bits)
        graph.reshape_data(gather, [n, k * blocks.bits // 8])
    if blocks.offset is not None:
        graph.add_offset(node, blocks.offset, k)
        for gather in gathers:  # the tied embedding shares the blocks, and adds the offsets
            graph.add_gather_offset(gather.name, gather.output[0], gather.input[1], blocks.offset)
    return None


_EMBEDDING = _Part("token_embd.weight", "model.embed_tokens.weight")


def _input_importance(importance: dict[str, Array] | None, part: _Part) -> Array | None:
    """The importance of the part's input channels. A tied lm_head's blocks are the token
    embedding's too, whose lookup has no input to weigh: none (as llama.cpp's imatrix
    has no entry for `token_embd`)."""
    if importance is None or part.checkpoint == _EMBEDDING.checkpoint:
        return None
    return importance.get(part.checkpoint)


def _embed(graph: _Graph, source: _Source, report: ImportReport, compact: bool) -> None:
    """Look tokens up in the GGUF's own quantized embedding (GatherBlockQuantized; a
    format with offsets adds them from a [vocab, K/32] table) where the builder left an
    fp32 Gather: Qwen2.5-0.5B's is 545 MB in fp32, 157 MB as its Q5_0 blocks."""
    from onnx import helper

    gather = next(
        (
            n
            for n in graph.graph.node
            if n.op_type == "Gather" and n.input[0] in graph.inits and "embed_tokens" in n.name
        ),
        None,
    )
    if gather is None:
        return  # none, or already quantized (tied to the lm_head)
    found = source.blocks(_EMBEDDING)
    if isinstance(found, str):
        report.requantized[_EMBEDDING.gguf] = f"kept as the builder's fp32 embedding: {found}"
        return
    kind = source.tensors[_EMBEDDING.gguf].tensor_type.name
    if compact and found.bits == 8:
        found = found.compact()
        report.compacted[_EMBEDDING.gguf] = kind
    else:
        report.exact[_EMBEDDING.gguf] = kind
    blocks = found.centred()
    n, k = blocks.q.shape
    weight, scale, zero = _pack(blocks)
    base, out = gather.name.rsplit("/", 1)[0] + "/ortserve", gather.output[0]
    graph.put(f"{base}/data", weight.reshape(n, k * blocks.bits // 8))
    graph.put(f"{base}/scales", scale)
    inputs = [f"{base}/data", gather.input[1], f"{base}/scales"]
    if not blocks.default_zero:
        graph.put(f"{base}/zero_points", zero)
        inputs.append(f"{base}/zero_points")
    graph.after.setdefault(gather.name, []).append(
        helper.make_node(
            "GatherBlockQuantized",
            inputs,
            [out],
            f"{base}/GatherBlockQuantized",
            domain="com.microsoft",
            bits=blocks.bits,
            block_size=blocks.block,
            gather_axis=0,
            quantize_axis=1,
        )
    )
    if blocks.offset is not None:
        graph.add_gather_offset(gather.name, out, gather.input[1], blocks.offset)
    graph.remove(gather)


def import_exact(
    gguf: Path,
    model_dir: Path,
    checkpoint: Path,
    graph_file: str,
    compact: bool = False,
    importance: dict[str, Array] | None = None,
) -> ImportReport:
    """Replace the quantized weights of `model_dir`'s graph by `gguf`'s own.

    Args:
        gguf: The GGUF file the checkpoint was converted from.
        model_dir: The builder's output folder.
        checkpoint: The fp32 checkpoint converted from `gguf` (the reference).
        graph_file: The graph's file name in `model_dir`.
        compact: Make the formats MatMulNBits holds exactly only as 8 bits (Q5_x, Q6_K,
            Q8_0) 4-bit blocks of 32 (Blocks.compact); 4-bit formats stay exact.
        importance: For `compact`: each projection's input importance by its checkpoint
            weight name (bake.importance.collect); None weighs by the values alone.

    Returns:
        Which GGUF tensors are now exact, and which kept the builder's weights and why.
    """
    source = _Source(gguf, checkpoint)
    graph = _Graph(model_dir / graph_file)
    tied = "lm_head.weight" not in source.names or "output.weight" not in source.tensors
    report = ImportReport()
    for node in list(graph.graph.node):
        if node.op_type != "MatMulNBits":
            continue
        parts = _parts(node.name, tied, source.has)
        if parts is None:
            report.requantized[node.name] = "no GGUF tensor known for this node"
            continue
        found = [source.blocks(part) for part in parts]
        why = next(
            (f"{p.gguf}: {f}" for p, f in zip(parts, found, strict=True) if isinstance(f, str)),
            None,
        )
        if why is None:
            blocks = [f for f in found if isinstance(f, Blocks)]
            if compact:
                blocks = [
                    b.compact(_input_importance(importance, p))
                    for b, p in zip(blocks, parts, strict=True)
                ]
            reason = _replace(graph, node, concat(blocks))
            why = None if reason is None else f"{parts[0].gguf}: {reason}"
        if why is not None:
            for part in parts:
                report.requantized[part.gguf] = why
            continue
        for part, was in zip(parts, found, strict=True):
            kind = source.tensors[part.gguf].tensor_type.name
            wide = isinstance(was, Blocks) and was.bits == 8
            (report.compacted if compact and wide else report.exact)[part.gguf] = kind
    _embed(graph, source, report, compact)
    graph.save()
    say(
        f"GGUF import: {len(report.exact)} weights exact from {gguf.name}"
        + (f", {len(report.compacted)} made 4-bit (compact)" if report.compacted else "")
        + (f", {len(report.requantized)} requantized by the builder" if report.requantized else "")
    )
    for name, why in sorted(report.requantized.items()):
        say(f"  requantized {name}: {why}")
    return report

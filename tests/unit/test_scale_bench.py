"""The size-envelope benchmark's own measures: the weight bytes a decode step reads (og
and GGUF), and the memory of a whole process tree."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from benchmarks.scale import _tree_rss, gguf_bytes_per_token, og_bytes_per_token


def _graph_model(tied: bool, folder: Path) -> Path:
    """Gather from an embedding [64, 8], then MatMul by a [8, 16] weight; `tied`: the
    MatMul also reads the embedding (transposed use is irrelevant to the byte count)."""
    emb = numpy_helper.from_array(np.ones((64, 8), np.float32), "emb")
    weight = numpy_helper.from_array(np.ones((8, 16), np.float32), "w")
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["h"]),
        helper.make_node("MatMul", ["h", "w"], ["y"]),
    ]
    if tied:
        nodes.append(helper.make_node("MatMul", ["h", "emb_t"], ["z"]))
        nodes.insert(0, helper.make_node("Transpose", ["emb"], ["emb_t"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        initializer=[emb, weight],
    )
    folder.mkdir()
    path = folder / "model.onnx"
    onnx.save(
        helper.make_model(graph),
        str(path),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    return folder


def test_og_reads_every_weight_but_an_embedding_it_only_gathers(tmp_path: Path) -> None:
    assert og_bytes_per_token(_graph_model(False, tmp_path / "a")) == 8 * 16 * 4
    assert og_bytes_per_token(_graph_model(True, tmp_path / "b")) == (64 * 8 + 8 * 16) * 4


def test_llama_cpp_skips_the_token_embedding_only_when_an_output_matrix_exists(
    tmp_path: Path,
) -> None:
    from gguf import GGUFWriter

    def write(path: Path, names: list[str]) -> Path:
        writer = GGUFWriter(str(path), "llama")
        for name in names:
            writer.add_tensor(name, np.ones((32, 16), np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    one = 32 * 16 * 4
    untied = write(tmp_path / "u.gguf", ["token_embd.weight", "output.weight", "blk.0.w"])
    tied = write(tmp_path / "t.gguf", ["token_embd.weight", "blk.0.w"])
    assert gguf_bytes_per_token(untied) == 2 * one
    assert gguf_bytes_per_token(tied) == 2 * one


def test_the_tree_holds_a_childs_memory() -> None:
    code = (
        "import subprocess, sys; subprocess.run([sys.executable, '-c', "
        "'import time; x = bytearray(200 << 20); time.sleep(5)'])"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        biggest = 0
        while time.monotonic() < deadline and biggest < 200 << 20:
            tree = _tree_rss(proc.pid)
            biggest = max((size for _, size in tree.values()), default=0)
            time.sleep(0.2)
        assert len(tree) == 2  # the parent and its child
        assert biggest >= 200 << 20
    finally:
        proc.kill()
        proc.wait()


def test_lambda_fits_by_the_memory_its_own_bake_declares() -> None:
    """Lambda serves one request at a time: its bake sizes MemorySize for one sequence, and
    that (not the four-sequence memory of the other targets) is held against 10,240 MB."""
    from benchmarks.scale import _fits

    art = {"lambda_bundle_bytes": 4 * 10**9, "memory_mib": 10569, "lambda_memory_mb": 7113}
    assert _fits({"artefacts": art}) == {"lambda": True, "cloudrun": True, "board_8gb": False}
    too_big = {**art, "lambda_memory_mb": 10300}
    assert _fits({"artefacts": too_big})["lambda"] is False

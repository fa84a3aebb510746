"""The exact import's builder input (#36): a checkpoint's fp32 matrices in bf16, streamed."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ortserve.bake import upstream


def test_matrices_become_bf16_as_torch_rounds_them_and_the_rest_stays(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "a.weight": torch.randn(37, 64, generator=generator) * 3,
        "norm.weight": torch.randn(64, generator=generator),
        "b.weight": torch.randn(5, 7, 3, generator=generator),
        "ids": torch.arange(10, dtype=torch.int64),
        "half": torch.randn(4, 4, generator=generator).to(torch.float16),
    }
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    # Small chunks: a matrix is converted in several pieces.
    upstream._CHUNK_VALUES, chunk = 100, upstream._CHUNK_VALUES
    try:
        upstream.bf16_weights(src, out)
    finally:
        upstream._CHUNK_VALUES = chunk
    got = load_file(str(out / "model.safetensors"))
    assert set(got) == set(tensors)
    for name in ("a.weight", "b.weight"):
        assert got[name].dtype == torch.bfloat16
        assert torch.equal(got[name], tensors[name].to(torch.bfloat16))
    for name in ("norm.weight", "ids", "half"):
        assert got[name].dtype == tensors[name].dtype and torch.equal(got[name], tensors[name])
    size = (out / "model.safetensors").stat().st_size
    assert size < (src / "model.safetensors").stat().st_size


def test_a_sharded_checkpoint_keeps_its_index(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    save_file({"a": torch.ones(2, 2)}, str(src / "one.safetensors"))
    save_file({"b": torch.ones(3)}, str(src / "two.safetensors"))
    index = {"metadata": {}, "weight_map": {"a": "one.safetensors", "b": "two.safetensors"}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    upstream.bf16_weights(src, out)
    assert json.loads((out / "model.safetensors.index.json").read_text()) == index
    assert load_file(str(out / "one.safetensors"))["a"].dtype == torch.bfloat16
    assert load_file(str(out / "two.safetensors"))["b"].dtype == torch.float32

"""Which graph of an ONNX export the bake picks: the onnx-community variant rule."""

from __future__ import annotations

import pytest

from ortserve.bake.errors import BakeError
from ortserve.bake.onnx_source import choose_variant, graphs_in

COMMUNITY = [
    "onnx/model.onnx",
    "onnx/model_fp16.onnx",
    "onnx/model_int8.onnx",
    "onnx/model_q4.onnx",
    "onnx/model_q4f16.onnx",
    "onnx/model_quantized.onnx",
    "onnx/model_uint8.onnx",
]


def test_graphs_are_found_at_the_top_and_in_onnx_only() -> None:
    files = [
        "config.json",
        "onnx/model.onnx",
        "onnx/model.onnx_data",
        "model.onnx",
        "other/model.onnx",
        "onnx/deep/model.onnx",
        "README.md",
    ]
    assert graphs_in(files) == ["model.onnx", "onnx/model.onnx"]


def test_cpu_prefers_4bit_with_fp32_activations_then_int8_then_fp32() -> None:
    assert choose_variant(COMMUNITY, "cpu", None).path == "onnx/model_q4.onnx"
    assert "4-bit weights, fp32 activations" in choose_variant(COMMUNITY, "cpu", None).reason
    no_q4 = [g for g in COMMUNITY if "q4" not in g]
    assert choose_variant(no_q4, "cpu", None).path == "onnx/model_int8.onnx"
    only_floats = ["onnx/model.onnx", "onnx/model_fp16.onnx", "onnx/model_q4f16.onnx"]
    assert choose_variant(only_floats, "cpu", None).path == "onnx/model_q4f16.onnx"
    assert choose_variant(only_floats[:2], "cpu", None).path == "onnx/model.onnx"


def test_cuda_prefers_fp16() -> None:
    assert choose_variant(COMMUNITY, "cuda", None).path == "onnx/model_fp16.onnx"


def test_onnx_file_wins_and_must_exist() -> None:
    chosen = choose_variant(COMMUNITY, "cpu", "./onnx/model_uint8.onnx")
    assert (chosen.path, chosen.reason) == ("onnx/model_uint8.onnx", "chosen with --onnx-file")
    with pytest.raises(BakeError, match=r"--onnx-file onnx/model_q8\.onnx: no such graph"):
        choose_variant(COMMUNITY, "cpu", "onnx/model_q8.onnx")


def test_several_flat_or_unknown_graphs_need_onnx_file() -> None:
    with pytest.raises(BakeError, match=r"2 ONNX graphs \(a\.onnx, b\.onnx\).*--onnx-file"):
        choose_variant(["a.onnx", "b.onnx"], "cpu", None)
    with pytest.raises(BakeError, match="--onnx-file"):
        choose_variant(["onnx/decoder.onnx", "onnx/encoder.onnx"], "cpu", None)
    assert choose_variant(["onnx/decoder.onnx"], "cpu", None).reason == "the only graph"

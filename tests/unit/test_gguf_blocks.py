"""Every mapped GGUF block format reads, exactly, as gguf-py dequantizes it."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from ortserve.bake.gguf_blocks import MAPPED_TYPES, concat, decode

# Where each format keeps its fp16 scales (byte offsets in a block): random bytes there
# could be NaN or huge, so the test writes real fp16 values.
_HALVES = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}


def random_rows(
    kind: str, rows: int, columns: int, seed: int = 0, scale: float = 1.0
) -> np.ndarray:
    """Random valid rows of `kind`: every bit pattern of the integers, fp16 scales
    drawn from [0.001, 0.05]·`scale`."""
    qtype = GGMLQuantizationType[kind]
    per, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, columns // per, size), dtype=np.uint8)
    for at in _HALVES[kind]:
        halves = (rng.uniform(0.001, 0.05, (rows, columns // per)) * scale).astype("<f2")
        raw[..., at : at + 2] = halves[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", MAPPED_TYPES)
def test_every_type_decodes_to_gguf_pys_own_dequantization(kind: str) -> None:
    raw = random_rows(kind, 24, 512)
    blocks = decode(kind, raw, 512)
    expected = quants.dequantize(raw, GGMLQuantizationType[kind])
    assert blocks.q.shape == (24, 512) and int(blocks.q.max()) < 2**blocks.bits
    # Exact up to float rounding: a K-quant's d·sc·q - dmin·m is computed here as
    # d·sc·(q - zero) + (zero·d·sc - dmin·m).
    atol = 1e-6 * float(np.abs(expected).max())
    np.testing.assert_allclose(blocks.dequantize(), expected, rtol=0, atol=atol)
    # The integers MatMulNBits needs: a zero point per block, an offset only where the
    # format has one.
    assert (blocks.offset is not None) == (kind in ("Q4_1", "Q5_1", "Q4_K", "Q5_K"))


def test_a_fused_projection_of_mixed_formats_keeps_every_weight() -> None:
    """q Q4_K (4-bit, offsets), k Q6_K (8-bit, block 16), v Q8_0: one 8-bit block-16
    weight, rows in order."""
    parts = [
        decode(k, random_rows(k, 8, 256, seed=i), 256)
        for i, k in enumerate(("Q4_K", "Q6_K", "Q8_0"))
    ]
    fused = concat(parts)
    assert (fused.bits, fused.block) == (8, 16) and fused.offset is not None
    expected = np.concatenate([p.dequantize() for p in parts])
    atol = 1e-6 * float(np.abs(expected).max())
    np.testing.assert_allclose(fused.dequantize(), expected, rtol=0, atol=atol)


def test_rows_of_the_wrong_length_are_refused() -> None:
    with pytest.raises(ValueError, match="are not 512 values"):
        decode("Q4_0", random_rows("Q4_0", 2, 256), 512)
    with pytest.raises(KeyError):
        decode("IQ4_NL", random_rows("Q4_0", 2, 256), 256)


def test_zero_points_are_set_or_left_out_keeping_a_bias_input() -> None:
    """MatMulNBits's inputs are (A, B, scales, zero_points, g_idx, bias): an imported
    weight's zero points change without losing a bias the builder put after them."""
    from onnx import helper

    from ortserve.bake.gguf_import import _set_zero_points

    node = helper.make_node("MatMulNBits", ["a", "b", "s", "z", "", "bias"], ["y"])
    _set_zero_points(node, "")
    assert list(node.input) == ["a", "b", "s", "", "", "bias"]
    _set_zero_points(node, "z2")
    assert list(node.input) == ["a", "b", "s", "z2", "", "bias"]
    plain = helper.make_node("MatMulNBits", ["a", "b", "s", "z"], ["y"])
    _set_zero_points(plain, "")
    assert list(plain.input) == ["a", "b", "s"]
    _set_zero_points(plain, "z3")
    assert list(plain.input) == ["a", "b", "s", "z3"]


@pytest.mark.parametrize("kind", ["Q5_0", "Q6_K", "Q8_0"])
def test_a_compact_8_bit_form_is_4_bit_blocks_closer_than_round_to_nearest(kind: str) -> None:
    """#36 `--compact`: the 8-bit forms become 4-bit blocks of 32 with a zero point each,
    whose error is below plain asymmetric round-to-nearest's on the same blocks."""
    exact = decode(kind, random_rows(kind, 40, 512, seed=3), 512)
    compact = exact.compact()
    assert (compact.bits, compact.block, compact.offset) == (4, 32, None)
    assert compact.q.shape == (40, 512) and compact.scale.shape == compact.zero.shape == (40, 16)
    assert int(compact.q.max()) <= 15 and int(compact.zero.max()) <= 15
    want = exact.dequantize()
    blocks = want.reshape(-1, 32)
    low = np.minimum(blocks.min(1, keepdims=True), 0)
    scale = (np.maximum(blocks.max(1, keepdims=True), 0) - low) / 15
    zero = np.rint(-low / scale)
    nearest = (np.clip(np.rint(blocks / scale + zero), 0, 15) - zero) * scale
    weights = np.sqrt((blocks**2).mean(1, keepdims=True)) + np.abs(blocks)
    got = compact.dequantize().reshape(-1, 32)
    searched = float((weights * (got - blocks) ** 2).sum())
    assert searched < 0.95 * float((weights * (nearest - blocks) ** 2).sum())
    assert float(np.abs(got - blocks).max()) <= float(scale.max())


def test_a_compact_4_bit_form_stays_exact() -> None:
    exact = decode("Q4_K", random_rows("Q4_K", 4, 256), 256)
    assert exact.compact() is exact


def test_an_importance_matrix_lowers_the_error_on_the_inputs_it_was_measured_on() -> None:
    """#50: weighing each value's error by its input channel's mean square (an imatrix, as
    llama.cpp's quantizer does) gives a smaller error in the projection's outputs, on
    inputs where a few channels carry most of the signal (as real activations do), than
    weighing by the values alone."""
    exact = decode("Q6_K", random_rows("Q6_K", 64, 512, seed=5), 512)
    rng = np.random.default_rng(7)
    spread = np.where(rng.random(512) < 0.05, 30.0, 1.0)  # 5% of channels carry large values
    inputs = (rng.standard_normal((256, 512)) * spread).astype(np.float32)
    importance = (inputs * inputs).mean(0).astype(np.float32)
    want = exact.dequantize()

    def output_error(blocks: object) -> float:
        assert hasattr(blocks, "dequantize")
        return float((((blocks.dequantize() - want) @ inputs.T) ** 2).mean())

    plain, weighted = exact.compact(), exact.compact(importance)
    assert (weighted.bits, weighted.block) == (4, 32)
    assert output_error(weighted) < 0.8 * output_error(plain)
    # A uniform importance changes nothing of substance: the same kind of blocks.
    uniform = exact.compact(np.ones(512, np.float32))
    assert output_error(uniform) == pytest.approx(output_error(plain), rel=0.25)

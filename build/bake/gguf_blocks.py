"""GGUF block formats read as MatMulNBits sees weights: integers, scales, zero points.

Every common llama.cpp block format is, exactly, `w = scale·(q - zero) + offset`, with
`q` and `zero` small integers per block and `offset` a float per row and 32-block (zero
for the formats that have none):

| type | bits | block | zero | offset |
|---|---:|---:|---:|---|
| Q4_0 `d(q-8)` | 4 | 32 | 8 | — |
| Q4_1 `d·q + m` | 4 | 32 | 8 | m + 8d |
| Q5_0 `d(q-16)` | 8 | 32 | 16 | — |
| Q5_1 `d·q + m` | 8 | 32 | 16 | m + 16d |
| Q8_0 `d·q` (int8) | 8 | 32 | 128 (q+128) | — |
| Q4_K `d·sc·q - dmin·m` | 4 | 32 | 8 | 8·d·sc - dmin·m |
| Q5_K `d·sc·q - dmin·m` | 8 | 32 | 16 | 16·d·sc - dmin·m |
| Q6_K `d·sc·(q-32)` | 8 | 16 | 32 | — |

MatMulNBits takes integer zero points only (a float zero point takes the CPU kernel's
slow path), so an offset becomes a side term of the graph (bake.gguf_import). The
layouts follow ggml's reference dequantization (ggml-quants.c); the tests compare every
type with gguf-py's own dequantization.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]

# Side terms sum the input over blocks of this many columns.
OFFSET_BLOCK = 32


@dataclass
class Blocks:
    """A weight [N, K] as `scale[n, k // block]·(q[n, k] - zero[n, k // block]) +
    offset[n, k // 32]` (offset None: no offset).

    Attributes:
        q: uint8 [N, K], each value below 2**bits.
        scale: float32 [N, K // block].
        zero: uint8 [N, K // block].
        bits: 4 or 8.
        block: Columns per scale (16 or 32).
        offset: float32 [N, K // 32], or None.
    """

    q: Array
    scale: Array
    zero: Array
    bits: int
    block: int
    offset: Array | None = None

    @property
    def rows(self) -> int:
        return int(self.q.shape[0])

    def dequantize(self) -> Array:
        """The float32 weight [N, K] these blocks stand for."""
        n, k = self.q.shape
        per = self.q.reshape(n, k // self.block, self.block).astype(np.float32)
        zero = self.zero[..., None].astype(np.float32)
        w = ((per - zero) * self.scale[..., None]).reshape(n, k)
        if self.offset is not None:
            w += np.repeat(self.offset, OFFSET_BLOCK, axis=1)
        return w

    def widened(self, bits: int, block: int) -> Blocks:
        """The same weight with `bits` ≥ its own and `block` dividing its own (exact)."""
        if bits < self.bits or self.block % block:
            raise ValueError(f"{self.bits}-bit block {self.block} cannot become {bits}/{block}")
        times = self.block // block
        scale, zero = np.repeat(self.scale, times, axis=1), np.repeat(self.zero, times, axis=1)
        return Blocks(self.q, scale, zero, bits, block, self.offset)

    @property
    def default_zero(self) -> bool:
        """Whether every zero point is the kernels' default, 2**(bits-1) (8 or 128, as
        GatherBlockQuantized's too): then none needs storing."""
        return bool(np.all(self.zero == 1 << (self.bits - 1)))

    def centred(self) -> Blocks:
        """The same 8-bit weight with every zero point 128, the kernels' default (so none
        is stored): each block's integers shifted by 128 - zero, which keeps them in
        0..255 for every GGUF format (Q5_x: 112..143, Q6_K: 96..159). Exact; 4-bit
        blocks are returned as they are (their GGUF zero is 8, the default already)."""
        if self.bits != 8 or self.default_zero:
            return self
        shift = 128 - self.zero.astype(np.int16)
        q = self.q.astype(np.int16) + np.repeat(shift, self.block, axis=1)
        if q.min() < 0 or q.max() > 255:
            return self
        return Blocks(
            q.astype(np.uint8), self.scale, np.full_like(self.zero, 128), 8, self.block, self.offset
        )

    def compact(self, importance: Array | None = None) -> Blocks:
        """The weight as 4-bit blocks of 32 with a zero point each (no offset): the
        8-bit forms (Q5_x, Q6_K, Q8_0) requantized by llama.cpp's weighted scale-and-min
        search (`make_qkx2_quants`, as ORT's k_quant), from their exact values. Not exact:
        5.1 bits a weight where the 8-bit form takes 9 (10 for Q6_K's blocks of 16).

        `importance` (float32 [K], the mean square of each input channel on calibration
        text: bake.importance) weighs each value's error by the input it multiplies, as
        llama.cpp's quantizer does with an imatrix; None weighs by the values alone."""
        if self.bits == 4:
            return self
        n, k = self.q.shape
        q = np.empty((n, k), np.uint8)
        scale, zero = np.empty((n, k // 32), np.float32), np.empty((n, k // 32), np.uint8)
        rows = max(1, _REQUANTIZE_VALUES // k)

        def part(first: int) -> None:
            last = min(first + rows, n)
            found = _search4(self.take_rows(np.arange(first, last)).dequantize(), importance)
            q[first:last], scale[first:last], zero[first:last] = found

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(part, range(0, n, rows)))
        return Blocks(q, scale, zero, 4, 32)

    def take_rows(self, order: Array) -> Blocks:
        """The rows in `order` (rows are whole: a row permutation is exact)."""
        offset = None if self.offset is None else self.offset[order]
        return Blocks(
            self.q[order], self.scale[order], self.zero[order], self.bits, self.block, offset
        )


# Values requantized per task: a few hundred thousand rows' worth of float32 temporaries.
_REQUANTIZE_VALUES = 1 << 21
_SEARCH_STEPS = 20  # llama.cpp's q4_K: make_qkx2_quants(..., -1.0, 0.1, 20, ...)


def _search4(w: Array, importance: Array | None = None) -> tuple[Array, Array, Array]:
    """4-bit blocks of 32 for float32 `w` [N, K]: per block the scale and integer zero
    point that minimise the weighted error, trying 21 scales over the block's range (round
    to nearest is the first) and refitting each by weighted least squares for its
    integers. The weights are llama.cpp's for q4_K: |x| + rms(block) without an
    importance matrix, importance[j]·sqrt(σ² + x²) with one (σ² twice the block's mean
    square, `quantize_row_q4_K_impl`)."""
    n, k = w.shape
    x = w.reshape(-1, 32)
    if importance is None:
        weights = np.sqrt((x * x).mean(1, keepdims=True)) + np.abs(x)
    else:
        per_column = np.broadcast_to(importance.reshape(1, k), (n, k)).reshape(-1, 32)
        weights = per_column * np.sqrt(2 * (x * x).mean(1, keepdims=True) + x * x)
    low = np.minimum(x.min(1, keepdims=True), 0)
    span = np.maximum(x.max(1, keepdims=True), 0) - low
    span[span == 0] = 1
    best = np.full_like(low, np.inf)
    best_scale, best_zero, best_q = span / 15, np.zeros_like(low), np.zeros_like(x)
    for step in range(_SEARCH_STEPS + 1):
        trial = span / (15 - 1 + 0.1 * step) if step else span / 15
        zero = np.clip(np.rint(-low / trial), 0, 15)
        level = np.clip(np.rint(x / trial + zero), 0, 15) - zero
        wl = weights * level
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = (wl * x).sum(1, keepdims=True) / (wl * level).sum(1, keepdims=True)
        scale = np.where(np.isfinite(scale) & (scale > 0), scale, trial)
        error = scale * level - x
        mad = (weights * error * error).sum(1, keepdims=True)
        better = mad < best
        best = np.where(better, mad, best)
        best_scale = np.where(better, scale, best_scale)
        best_zero = np.where(better, zero, best_zero)
        best_q = np.where(better, level + zero, best_q)
    return (
        best_q.astype(np.uint8).reshape(n, k),
        best_scale.astype(np.float32).reshape(n, -1),
        best_zero.astype(np.uint8).reshape(n, -1),
    )


def concat(parts: list[Blocks]) -> Blocks:
    """Row-wise concatenation (a fused projection), at the widest bits and smallest block."""
    bits, block = max(p.bits for p in parts), min(p.block for p in parts)
    same = [p.widened(bits, block) for p in parts]
    offsets = None
    if any(p.offset is not None for p in same):
        offsets = np.concatenate(
            [
                p.offset
                if p.offset is not None
                else np.zeros((p.rows, p.q.shape[1] // OFFSET_BLOCK), np.float32)
                for p in same
            ]
        )
    return Blocks(
        np.concatenate([p.q for p in same]),
        np.concatenate([p.scale for p in same]),
        np.concatenate([p.zero for p in same]),
        bits,
        block,
        offsets,
    )


def _f16(raw: Array) -> Array:
    """Little-endian fp16 from the last axis's two bytes, as float32 (shape [..., 1])."""
    return np.ascontiguousarray(raw).view("<f2").astype(np.float32)


def _full(like: Array, value: int) -> Array:
    return np.full(like.shape[:2], value, np.uint8)


def _nibbles(qs: Array) -> Array:
    """A 32-block's 16 bytes: low nibbles are values 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _fifth_bits(qh: Array) -> Array:
    """Q5_0/Q5_1's 4 bytes of high bits (one uint32): bit j is value j's fifth bit."""
    word = np.ascontiguousarray(qh).view("<u4")
    return ((word >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _q4_0(b: Array) -> Blocks:
    d = _f16(b[..., 0:2])[..., 0]
    return Blocks(_nibbles(b[..., 2:18]), d, _full(d, 8), 4, 32)


def _q4_1(b: Array) -> Blocks:
    d, m = _f16(b[..., 0:2])[..., 0], _f16(b[..., 2:4])[..., 0]
    return Blocks(_nibbles(b[..., 4:20]), d, _full(d, 8), 4, 32, m + 8 * d)


def _q5_0(b: Array) -> Blocks:
    d = _f16(b[..., 0:2])[..., 0]
    q = _nibbles(b[..., 6:22]) | (_fifth_bits(b[..., 2:6]) << 4)
    return Blocks(q, d, _full(d, 16), 8, 32)


def _q5_1(b: Array) -> Blocks:
    d, m = _f16(b[..., 0:2])[..., 0], _f16(b[..., 2:4])[..., 0]
    q = _nibbles(b[..., 8:24]) | (_fifth_bits(b[..., 4:8]) << 4)
    return Blocks(q, d, _full(d, 16), 8, 32, m + 16 * d)


def _q8_0(b: Array) -> Blocks:
    d = _f16(b[..., 0:2])[..., 0]
    q = (np.ascontiguousarray(b[..., 2:34]).view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return Blocks(q, d, _full(d, 128), 8, 32)


def _k_scales(scales: Array) -> tuple[Array, Array]:
    """Q4_K/Q5_K's 12 bytes → the 8 sub-blocks' 6-bit scales and mins (ggml's
    get_scale_min_k4)."""
    s = scales.astype(np.uint8)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)], -1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _k_parts(b: Array, zero: int) -> tuple[Array, Array, Array]:
    """A K-quant super-block's scale, zero and offset per 32-sub-block."""
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = _k_scales(b[..., 4:16])
    scale = d * sc
    return scale, _full(scale.reshape(scale.shape[0], -1), zero), zero * scale - dmin * mn


def _q4_k(b: Array) -> Blocks:
    n, blocks = b.shape[:2]
    scale, zero, offset = _k_parts(b, 8)
    qs = b[..., 16:144].reshape(n, blocks, 4, 1, 32)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=3)  # chunk i → sub-blocks 2i, 2i+1
    return Blocks(q.reshape(n, -1), scale.reshape(n, -1), zero, 4, 32, offset.reshape(n, -1))


def _q5_k(b: Array) -> Blocks:
    n, blocks = b.shape[:2]
    scale, zero, offset = _k_parts(b, 16)
    qh = b[..., 16:48].reshape(n, blocks, 1, 1, 32)
    qs = b[..., 48:176].reshape(n, blocks, 4, 1, 32)
    shift = np.arange(8, dtype=np.uint8).reshape(1, 1, 4, 2, 1)  # sub-block j: bit j of qh
    high = ((qh >> shift) & 1) << 4
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=3) | high
    return Blocks(q.reshape(n, -1), scale.reshape(n, -1), zero, 8, 32, offset.reshape(n, -1))


def _q6_k(b: Array) -> Blocks:
    n, blocks = b.shape[:2]
    ql = b[..., 0:128].reshape(n, blocks, 2, 2, 32)  # half, first/second 32 bytes
    qh = b[..., 128:192].reshape(n, blocks, 2, 1, 32)
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32)
    d = _f16(b[..., 208:210])
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=3)  # q1, q2, q3, q4 of each half
    shift = (np.arange(4, dtype=np.uint8) * 2).reshape(1, 1, 1, 4, 1)
    q = low | (((qh >> shift) & 3) << 4)
    scale = (d * sc).reshape(n, -1)
    return Blocks(q.reshape(n, -1), scale, _full(scale, 32), 8, 16)


# type name → (bytes per block, values per block, decoder of [N, blocks, bytes])
_FORMATS: dict[str, tuple[int, int, Callable[[Array], Blocks]]] = {
    "Q4_0": (18, 32, _q4_0),
    "Q4_1": (20, 32, _q4_1),
    "Q5_0": (22, 32, _q5_0),
    "Q5_1": (24, 32, _q5_1),
    "Q8_0": (34, 32, _q8_0),
    "Q4_K": (144, 256, _q4_k),
    "Q5_K": (176, 256, _q5_k),
    "Q6_K": (210, 256, _q6_k),
}

MAPPED_TYPES = tuple(_FORMATS)


def decode(type_name: str, raw: Array, columns: int) -> Blocks:
    """The blocks of a GGUF tensor of `type_name` whose rows are `raw` (uint8 [N, bytes]).

    Raises:
        KeyError: A type that does not map (F16, IQ*, Q2_K, ...).
        ValueError: `raw` does not hold rows of `columns` values of that type.
    """
    size, per, decoder = _FORMATS[type_name]
    rows = raw.shape[0]
    if columns % per or raw.shape[1] != columns // per * size:
        raise ValueError(f"{type_name}: rows of {raw.shape[1]} bytes are not {columns} values")
    got = decoder(raw.reshape(rows, columns // per, size))
    offset = None if got.offset is None else got.offset.reshape(rows, -1)
    return Blocks(
        got.q.reshape(rows, columns),
        got.scale.reshape(rows, -1),
        got.zero.reshape(rows, -1),
        got.bits,
        got.block,
        offset,
    )

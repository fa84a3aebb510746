"""An int8 KV cache (`ortserve bake --kv-cache int8`): calibrated scales for og's builder.

og 0.18's builder stores GroupQueryAttention's keys and values as int8 on CPU with a
fixed scale per layer and channel (`kv_cache_quant_scheme=int8_per_channel`), which it
reads from a calibration file (`kv_cache_scale_file`) it does not make. This module
makes it: the checkpoint runs in fp32 (transformers) over a fixed text and a chat turn,
and each channel's scale is its largest |key| or |value| there, times a margin, over
og's int8 divisor. A key is cached after its rotary embedding, which turns channels i and
i + head/2 of a head together: both take the pair's largest norm, which bounds either
after any rotation. A key norm (Qwen3, Gemma-3) is applied before the bound is taken.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.bake.errors import BakeError

SCHEME = "int8_per_channel"
# og's int8 divisor (onnxruntime_genai.models.quantization KV_CACHE_CALIBRATION_QMAX).
_QMAX = 128.0
# Values up to this many times the calibration's largest still fit.
_MARGIN = 1.25
_CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a Python function that reverses a list."},
    {"role": "assistant", "content": "def reverse(items):\n    return items[::-1]"},
]


def calibrate(checkpoint: Path, out: Path) -> Path:
    """Write og's KV-cache scale file for `checkpoint` (an HF folder) to `out`.

    Raises:
        BakeError: The model's attention has no separate key and value projections.
    """
    from transformers import AutoTokenizer

    from ortserve.bake.quality import GATE_TEXT, chat_and_text_ids, reference_model

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    ids = chat_and_text_ids(tokenizer, _CHAT, GATE_TEXT, special_tokens=True)
    with reference_model(checkpoint) as model:
        largest, heads, head = _largest_keys_and_values(model, ids)
    keys = []
    for found in largest["k"]:
        pairs = found.reshape(heads, 2, head // 2)
        norm = np.sqrt((pairs**2).sum(1, keepdims=True))
        keys.append(np.broadcast_to(norm, pairs.shape).reshape(-1))

    def scales(values: list[Any]) -> list[list[float]]:
        return [(np.maximum(v, 1e-6) * _MARGIN / _QMAX).astype(float).tolist() for v in values]

    record = {"scales": {"k_scales": scales(keys), "v_scales": scales(largest["v"])}}
    out.write_text(json.dumps({**record, "qmax": _QMAX}), encoding="utf-8")
    return out


def _largest_keys_and_values(model: Any, ids: list[int]) -> tuple[dict[str, list[Any]], int, int]:
    """Each layer's largest |key| and |value| per channel over `ids` ("k", "v": a
    [kv heads x head size] array a layer), the KV heads and the head size."""
    from ortserve.bake.quality import forward_with_hooks

    config = model.config.get_text_config()
    heads = int(config.num_key_value_heads)
    head = int(getattr(config, "head_dim", 0) or config.hidden_size // config.num_attention_heads)
    largest: dict[str, list[Any]] = {"k": [], "v": []}
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise BakeError(
            f"--kv-cache int8: {type(model).__name__} has no decoder layers to calibrate"
        )
    hooks = []
    for layer in layers:
        attention = layer.self_attn
        key = getattr(attention, "k_norm", None) or getattr(attention, "k_proj", None)
        value = getattr(attention, "v_proj", None)
        if key is None or value is None:
            raise BakeError(
                f"--kv-cache int8: {type(attention).__name__} has no k_proj/v_proj to "
                "calibrate its cache from"
            )
        for kind, module in (("k", key), ("v", value)):
            index = len(largest[kind])
            largest[kind].append(np.zeros(heads * head, np.float32))

            def seen(_m: Any, _args: Any, out: Any, kind: str = kind, index: int = index) -> None:
                values = out.detach().float().abs().reshape(-1, heads * head).amax(0)
                largest[kind][index] = np.maximum(largest[kind][index], values.numpy())

            hooks.append(module.register_forward_hook(seen))
    forward_with_hooks(model, ids, hooks)
    return largest, heads, head

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
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bake.errors import BakeError, say

_GEMMA3 = ("gemma3_text", "gemma3")


def _flat_gemma3_rope(text_config: dict[str, Any]) -> dict[str, Any]:
    """`rope_parameters` with the builder's flat keys beside transformers' nested ones."""
    rope = dict(text_config.get("rope_parameters") or {})
    if not rope:  # transformers 4.x keys
        full = {"rope_type": "default", "rope_theta": text_config.get("rope_theta", 1e6)}
        full.update(text_config.get("rope_scaling") or {})
        full.pop("type", None)
        local = text_config.get("rope_local_base_freq", 1e4)
        rope = {"full_attention": full,
                "sliding_attention": {"rope_type": "default", "rope_theta": local}}  # fmt: skip
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


def builder_input(src: Path, work: Path, options: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """The folder and options to give the builder for checkpoint `src`: `src` itself, or a
    copy under `work` (links to the weights) with config.json fixed where needed.

    Raises:
        BakeError: A model the builder is known to bake wrong.
    """
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") not in _GEMMA3:
        return src, options
    text = config.get("text_config", config) if config["model_type"] == "gemma3" else config
    text["rope_parameters"] = _flat_gemma3_rope(text)
    work.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.name != "config.json":
            (work / path.name).symlink_to(path.resolve())
    (work / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    say("Gemma 3: flat RoPE keys added for the builder, windowed_kv_cache=false (README)")
    return work, {"windowed_kv_cache": "false", **options}

"""The context a bake serves: genai_config's `context_length` and the rotary caches.

The builder sizes the rotary caches (cos/sin tables, one row per position) and
genai_config's `context_length` to the model's maximum: 32k positions for Gemma-3-270M
carry 67 MB of caches, a quarter of its int4 weights, for a context ortserve's targets
never serve. A bake serves `--context-length` tokens (default: the model's maximum, at
most `DEFAULT_CONTEXT`): the caches keep that many rows and genai_config says it, so
the engine refuses longer prompts with a clear error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ortserve.bake.errors import BakeError, say
from ortserve.bake.onnx_source import save_graph

# What a bake serves unless asked for more (up to the model's own maximum).
DEFAULT_CONTEXT = 8192
MIN_CONTEXT = 16
_ROTARY_PREFIXES = ("cos_cache", "sin_cache")


def fit_context(model_dir: Path, asked: int | None) -> int | None:
    """Cut `model_dir`'s context to `asked` tokens (None: the default); return the new
    context, or None when the model's own is kept.

    Raises:
        BakeError: `asked` is above the model's maximum.
    """
    path = model_dir / "genai_config.json"
    config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    model = config["model"]
    own = int(model.get("context_length") or 0)
    if asked is not None and asked < MIN_CONTEXT:
        raise BakeError(f"--context-length must be at least {MIN_CONTEXT} tokens, got {asked}")
    if asked is not None and own and asked > own:
        raise BakeError(f"--context-length {asked} is above the model's maximum, {own} tokens")
    tokens = asked if asked is not None else min(own, DEFAULT_CONTEXT)
    if not own or tokens >= own:
        return None
    cut = _cut_rotary_caches(model_dir / str(model["decoder"]["filename"]), tokens)
    model["context_length"] = tokens
    search = config.setdefault("search", {})
    search["max_length"] = min(int(search.get("max_length") or tokens), tokens)
    path.write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    saved = f"; rotary caches cut to {tokens} rows ({cut / 1e6:.1f} MB less)" if cut else ""
    say(f"context: {tokens} tokens (the model's maximum is {own}; --context-length){saved}")
    return tokens


def _cut_rotary_caches(graph_path: Path, rows: int) -> int:
    """Keep the first `rows` positions of every rotary cache; return the bytes saved."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(graph_path))
    saved = 0
    for index, tensor in enumerate(model.graph.initializer):
        if not tensor.name.startswith(_ROTARY_PREFIXES) or tensor.dims[0] <= rows:
            continue
        table = numpy_helper.to_array(tensor)
        saved += table.nbytes - table[:rows].nbytes
        model.graph.initializer[index].CopyFrom(numpy_helper.from_array(table[:rows], tensor.name))
    if saved:
        save_graph(model, graph_path)
    return saved

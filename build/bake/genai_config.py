"""genai_config.json: infer it for ONNX exports that lack one, and bake session options in."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ortserve.bake.errors import BakeError

# Hugging Face model_type → onnxruntime-genai model type, for the decoder-only families
# whose Optimum / transformers.js export has the inputs and outputs read below
# (input_ids, attention_mask, position_ids, past_key_values.N.key/value → logits,
# present.N.key/value). The og types are those its model builder writes for these
# architectures; each was checked to load and generate with onnxruntime-genai 0.18.
_MODEL_TYPES = {
    name: name
    for name in (
        "gemma",
        "gemma2",
        "gemma3_text",
        "granite",
        "llama",
        "mistral",
        "nemotron",
        "olmo",
        "phi",
        "phi3",
        "qwen2",
        "qwen3",
        "smollm3",
    )
}
_LAYER = re.compile(r"\.(\d+)\.")


def _pattern(names: list[str], kind: str) -> str | None:
    """Turn names such as past_key_values.0.key into a %d pattern, if `kind` matches."""
    for name in names:
        if name.endswith(kind) and _LAYER.search(name):
            return _LAYER.sub(".%d.", name, count=1)
    return None


def _graph_io(model_path: Path) -> tuple[list[str], list[str]]:
    from ortserve.bake.onnx_source import load_graph

    model = load_graph(model_path)
    return [i.name for i in model.graph.input], [o.name for o in model.graph.output]


def _eos(config: dict[str, Any], folder: Path) -> int | list[int]:
    gen_path = folder / "generation_config.json"
    if gen_path.is_file():
        eos = json.loads(gen_path.read_text(encoding="utf-8")).get("eos_token_id")
        if eos is not None:
            return eos  # type: ignore[no-any-return]  # JSON: an int or a list of ints
    eos = config.get("eos_token_id")
    if eos is None:
        raise BakeError("cannot infer eos_token_id: not in config.json or generation_config.json")
    return eos  # type: ignore[no-any-return]  # JSON: an int or a list of ints


def infer_genai_config(
    folder: Path, graph: str, filename: str = "model.onnx"
) -> tuple[dict[str, Any], list[str]]:
    """Build a genai_config for an ONNX decoder export from config.json and the graph.

    Args:
        folder: The export's folder, with config.json (and generation_config.json).
        graph: The graph to read the inputs and outputs of, relative to `folder`.
        filename: The graph's file name in the baked folder (the config's `filename`).

    Returns:
        The config and a list of what was inferred, one line each.

    Raises:
        BakeError: config.json is missing, the model family is not one onnxruntime-genai
            runs from an export, or the graph's inputs/outputs are not the
            decoder-with-past layout it runs.
    """
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise BakeError(f"{folder} has no genai_config.json and no config.json to infer it from")
    config: dict[str, Any] = json.loads(config_path.read_text(encoding="utf-8"))
    model_type = str(config.get("model_type", ""))
    if model_type not in _MODEL_TYPES:
        raise BakeError(
            f"cannot infer genai_config.json for model_type {model_type!r}; supported: "
            f"{', '.join(sorted(_MODEL_TYPES))} (or give a genai_config.json)"
        )
    inputs, outputs = _graph_io(folder / graph)
    past_key = _pattern(inputs, "key")
    past_value = _pattern(inputs, "value")
    present_key = _pattern(outputs, "key")
    present_value = _pattern(outputs, "value")
    if "input_ids" not in inputs or "logits" not in outputs:
        raise BakeError("cannot infer genai_config.json: the graph has no input_ids/logits")
    if not (past_key and past_value and present_key and present_value):
        raise BakeError("cannot infer genai_config.json: the graph has no KV-cache inputs/outputs")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    io_inputs = {
        "input_ids": "input_ids",
        "past_key_names": past_key,
        "past_value_names": past_value,
    }
    for optional in ("attention_mask", "position_ids"):
        if optional in inputs:
            io_inputs[optional] = optional
    decoder = {
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        "filename": filename,
        "head_size": int(config.get("head_dim") or hidden // heads),
        "hidden_size": hidden,
        "inputs": io_inputs,
        "outputs": {
            "logits": "logits",
            "present_key_names": present_key,
            "present_value_names": present_value,
        },
        "num_attention_heads": heads,
        "num_hidden_layers": int(config["num_hidden_layers"]),
        "num_key_value_heads": int(config.get("num_key_value_heads", heads)),
    }
    context = int(config.get("max_position_embeddings", 2048))
    genai: dict[str, Any] = {
        "model": {
            "bos_token_id": config.get("bos_token_id"),
            "context_length": context,
            "decoder": decoder,
            "eos_token_id": _eos(config, folder),
            "pad_token_id": config.get("pad_token_id") or 0,
            "type": _MODEL_TYPES[model_type],
            "vocab_size": int(config["vocab_size"]),
        },
        "search": {"max_length": context, "past_present_share_buffer": False},
    }
    inferred = [
        f"genai_config.json was missing: inferred from config.json and {graph}",
        f"model type {model_type}, {decoder['num_hidden_layers']} layers, "
        f"{heads} heads / {decoder['num_key_value_heads']} KV heads, head size "
        f"{decoder['head_size']}, context {context}",
        f"inputs {sorted(io_inputs.values())}; KV cache {past_key} / {present_key}",
    ]
    return genai, inferred


def set_session_options(config_path: Path, threads: int) -> None:
    """Bake the target's session options into an existing genai_config.json (its
    decoder's, and its draft model's where it has one)."""
    data = json.loads(config_path.read_text(encoding="utf-8"))
    for section in ("decoder", "draft"):
        if section in data["model"]:
            options = data["model"][section].setdefault("session_options", {})
            options["intra_op_num_threads"] = threads
    config_path.write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8")


def add_draft(config_path: Path, draft_config: Path, graph: str) -> None:
    """Give the genai_config.json at `config_path` a draft model (og 0.18's `model.draft`:
    a decoder section, which draft-model speculative decoding reads): the decoder of the
    genai_config at `draft_config`, its graph at `graph` (relative to the folder)."""
    data = json.loads(config_path.read_text(encoding="utf-8"))
    decoder = json.loads(draft_config.read_text(encoding="utf-8"))["model"]["decoder"]
    data["model"]["draft"] = {**decoder, "filename": graph}
    config_path.write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8")

"""Bake recipes: which weights of an int4 bake are raised to int8, layer by layer.

A recipe is og's int4 algorithm (`algo_config`, block size, accuracy level) plus rules
such as "qkv, o and down_proj int8 in every layer" or "gate/up int8 in the first and
last three layers". It is expanded for the model's layer count into the builder's
per-node overrides (`--target_options {"quant_config": {"weights": {"overrides":
[...]}}}`): og 0.18's builder honours there only a `preset` or an exact node `name`,
first match wins, and the presets that `algo_config` implies (e.g. k_quant_mixed's
int8 lm_head and llama.cpp's "mixed" layers) must be repeated in the list, which
replaces them otherwise. So the rules come first as exact names (a rule beats a
preset), then the presets.

With `--target_options`, og 0.18's builder also drops the `Gather` that
`shared_embeddings` adds to the quantized op types, so a tied embedding comes back as
an fp32 Gather of its own (+113 MB on SmolLM2-135M): the op types are given explicitly
for a tied model, which keeps the embedding tied to the quantized lm_head.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ortserve.bake.errors import BakeError

Role = Literal["qkv", "o", "gate", "up", "down"]
QuantType = Literal["int4", "int8"]
# The builder's node names (og 0.18, every decoder it builds as llama-like: llama, qwen2/3,
# smollm, gemma3). q, k and v are one packed MatMul on CPU unless fusion is switched off.
_ROLE_NODES: dict[str, tuple[str, ...]] = {
    "qkv": ("attn/qkv_proj",),
    "o": ("attn/o_proj",),
    "gate": ("mlp/gate_proj",),
    "up": ("mlp/up_proj",),
    "down": ("mlp/down_proj",),
}
_UNFUSED_QKV = ("attn/q_proj", "attn/k_proj", "attn/v_proj")
# og 0.18's `algo_config` aliases and the presets they imply
# (onnxruntime_genai/models/quantization/quant_config.py, _LEGACY_ALGO_ALIASES).
_ALGO_PRESETS: dict[str, dict[str, str]] = {
    "rtn_last": {"last_matmul": "int8"},
    "k_quant_last": {"last_matmul": "int8"},
    "k_quant_mixed": {"last_matmul": "int8", "mixed_layers": "int8"},
    "k_quant_linear": {"last_matmul": "int8", "linear_attn": "int8"},
}
ALGOS = ("default", "rtn", "k_quant", *_ALGO_PRESETS)
_RANGE = re.compile(r"^\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*$")


class Rule(BaseModel):
    """Weights of some roles, in some layers, quantized to `type`.

    `layers` is "all" or a list of layer indexes (negative ones count from the last,
    as in Python) and inclusive ranges "A..B" (e.g. "0..2", "-3..-1"); a range is
    clipped to the model's layers, a single index must exist.
    """

    model_config = ConfigDict(extra="forbid")

    roles: list[Role] = Field(min_length=1)
    layers: Literal["all"] | list[int | str] = "all"
    type: QuantType

    @field_validator("layers")
    @classmethod
    def _ranges_parse(
        cls, value: Literal["all"] | list[int | str]
    ) -> Literal["all"] | list[int | str]:
        if value == "all":
            return value
        if not value:
            raise ValueError('an empty list selects no layer (use "all" or indexes)')
        for item in value:
            if isinstance(item, str) and not _RANGE.match(item):
                raise ValueError(f'{item!r} is not a layer range "A..B" (e.g. "0..2", "-3..-1")')
        return value


class Recipe(BaseModel):
    """An int4 bake's quantization: og's algorithm and block, then int8 rules per layer."""

    model_config = ConfigDict(extra="forbid")

    description: str = ""
    algo_config: str = "k_quant_mixed"
    block_size: int = 32
    accuracy_level: int = Field(default=4, ge=0, le=4)
    rules: list[Rule] = Field(default_factory=list)

    @field_validator("algo_config")
    @classmethod
    def _known_algo(cls, value: str) -> str:
        if value not in ALGOS:
            raise ValueError(f"{value!r} is not one of og's algorithms: {', '.join(ALGOS)}")
        return value

    @field_validator("block_size")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value < 16 or value > 256 or value & (value - 1):
            raise ValueError(f"block_size must be a power of two from 16 to 256, got {value}")
        return value

    def builder_options(self) -> dict[str, str]:
        """The builder's `--extra_options` for this recipe's algorithm."""
        return {
            "block_size": str(self.block_size),
            "accuracy_level": str(self.accuracy_level),
            "algo_config": self.algo_config,
        }


_EVERY_ROLE: list[Role] = ["qkv", "o", "gate", "up", "down"]
RECIPES: dict[str, Recipe] = {
    "k-quant-mixed": Recipe(
        description="og's k_quant at block 32, the lm_head and llama.cpp's 'mixed' layers "
        "(qkv and down_proj of the first and last eighth and every third layer) int8",
    ),
    "q4km-like": Recipe(
        description="k-quant-mixed + qkv, o_proj and down_proj int8 in every layer and "
        "gate/up_proj int8 in the first and last three layers",
        rules=[
            Rule(roles=["qkv", "o", "down"], layers="all", type="int8"),
            Rule(roles=["gate", "up"], layers=["0..2", "-3..-1"], type="int8"),
        ],
    ),
    "int8": Recipe(
        description="every MatMul int8 (block 32), the embedding tied to the int8 lm_head",
        rules=[Rule(roles=_EVERY_ROLE, layers="all", type="int8")],
    ),
}
# The CPU targets' default: on SmolLM2-135M it meets llama.cpp Q4_K_M's perplexity with a
# better top-1 agreement at 1.29x its size (docs/measurements.md, "Quality", run 4).
DEFAULT_RECIPE = "q4km-like"
# What a family whose graph may not have the llama-like names gets by default.
BASIC_RECIPE = "k-quant-mixed"
# Families the builder builds with the node names above (og 0.18's llama/mistral/qwen
# path); a recipe the user names is tried on any family (the builder names a missing node).
LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "smollm3")


def default_recipe(target_recipe: str, config: dict[str, Any]) -> str:
    """The recipe a target's default means for a checkpoint with `config`: the target's,
    or BASIC_RECIPE (no per-layer rules) where the family may not have the names."""
    if not RECIPES[target_recipe].rules or config.get("model_type") in LLAMA_LIKE:
        return target_recipe
    return BASIC_RECIPE


def load_recipe(spec: str) -> tuple[str, Recipe]:
    """The recipe called `spec`, or the one in the JSON or TOML file `spec`.

    Returns:
        How the manifest names it (the name, or the file's path) and the recipe.

    Raises:
        BakeError: No such recipe or file, or a file that is not a valid recipe.
    """
    if spec in RECIPES:
        return spec, RECIPES[spec]
    path = Path(spec)
    if not path.is_file():
        raise BakeError(
            f"unknown recipe {spec!r}: name one of {', '.join(RECIPES)}, or a .json or "
            ".toml recipe file"
        )
    text = path.read_text(encoding="utf-8")
    try:
        data: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise BakeError(
            f"recipe {path}: not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}"
        ) from None
    try:
        return str(path), Recipe.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'recipe'}: {err['msg']}"
            for err in exc.errors()
        )
        raise BakeError(f"recipe {path}: {problems}") from None


def _layer_indexes(layers: Literal["all"] | list[int | str], count: int) -> list[int]:
    if layers == "all":
        return list(range(count))
    chosen: list[int] = []
    for item in layers:
        if isinstance(item, int):
            index = item + count if item < 0 else item
            if not 0 <= index < count:
                raise BakeError(f"recipe: layer {item} does not exist in a model of {count} layers")
            chosen.append(index)
            continue
        match = _RANGE.match(item)
        assert match is not None  # Rule validated it
        start, end = (int(g) + count if int(g) < 0 else int(g) for g in match.groups())
        chosen.extend(range(max(start, 0), min(end, count - 1) + 1))
    return chosen


def node_types(recipe: Recipe, num_layers: int, fused_qkv: bool = True) -> dict[str, str]:
    """Each MatMul a rule names (the builder's node names) and its type; a later rule
    wins where two name the same weight.

    Raises:
        BakeError: A rule names a layer the model does not have.
    """
    types: dict[str, str] = {}
    for rule in recipe.rules:
        for layer in _layer_indexes(rule.layers, num_layers):
            for role in rule.roles:
                nodes = _UNFUSED_QKV if role == "qkv" and not fused_qkv else _ROLE_NODES[role]
                for node in nodes:
                    types[f"/model/layers.{layer}/{node}/MatMul"] = rule.type
    return types


def _true(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes")


def _presets(recipe: Recipe, options: dict[str, str]) -> dict[str, str]:
    """The presets the final options imply: `algo_config`'s, then `matmul_mixed_precision`'s
    ("selector:type,..."), as og's desugar_algo_config merges them."""
    presets = dict(_ALGO_PRESETS.get(options.get("algo_config", recipe.algo_config), {}))
    for entry in options.get("matmul_mixed_precision", "").split(","):
        selector, _, kind = entry.partition(":")
        if selector.strip():
            presets[selector.strip()] = kind.strip()
    return presets


def target_options(
    recipe: Recipe, options: dict[str, str], config: dict[str, Any]
) -> dict[str, Any] | None:
    """The builder's `--target_options` for `recipe` on a checkpoint with `config`
    (config.json), given the final extra options; None when the recipe has no rules.

    Raises:
        BakeError: The model's layer count is unknown, or a rule names a missing layer.
    """
    if not recipe.rules:
        return None
    text = config.get("text_config", config)
    num_layers = text.get("num_hidden_layers")
    if not isinstance(num_layers, int):
        raise BakeError("recipe: config.json has no num_hidden_layers to expand the rules for")
    fused = not _true(options.get("disable_qkv_fusion", "false")) and _true(
        options.get("fuse_qkv", "true")
    )
    # The list replaces what the legacy options said: their exclusions come first (og
    # applies them unconditionally), the presets last.
    excluded = [n.strip() for n in options.get("nodes_to_exclude", "").split(",") if n.strip()]
    overrides: list[dict[str, Any]] = [{"match": {"name": n}, "exclude": True} for n in excluded]
    overrides += [
        {"match": {"name": name}, "type": kind}
        for name, kind in node_types(recipe, num_layers, fused).items()
        if name not in excluded
    ]
    overrides += [
        {"match": {"preset": preset}, "type": kind}
        for preset, kind in _presets(recipe, options).items()
    ]
    weights: dict[str, Any] = {"overrides": overrides}
    tied = bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    if _true(options.get("shared_embeddings", str(tied))):
        weights["op_types"] = ["MatMul", "Gather"]
    return {"quant_config": {"weights": weights}}

"""Bake recipes: named and file recipes, expanded per layer into the builder's overrides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ortserve.bake.errors import BakeError
from ortserve.bake.recipes import (
    RECIPES,
    Recipe,
    Rule,
    default_recipe,
    load_recipe,
    node_types,
    target_options,
)
from ortserve.bake.targets import builder_options, get_target

# SmolLM2-135M's config.json, the parts a recipe reads.
SMOLLM2 = {"num_hidden_layers": 30, "tie_word_embeddings": True}


def _layer(name: str) -> int:
    return int(name.split("/")[2].removeprefix("layers."))


def _overrides(options: dict[str, Any] | None) -> list[dict[str, Any]]:
    assert options is not None
    overrides: list[dict[str, Any]] = options["quant_config"]["weights"]["overrides"]
    return overrides


def test_q4km_like_names_every_layers_qkv_o_down_and_the_edges_gate_up() -> None:
    types = node_types(RECIPES["q4km-like"], 30)
    assert set(types.values()) == {"int8"}
    for role in ("attn/qkv_proj", "attn/o_proj", "mlp/down_proj"):
        assert {_layer(n) for n in types if f"/{role}/" in n} == set(range(30))
    for role in ("mlp/gate_proj", "mlp/up_proj"):
        assert {_layer(n) for n in types if f"/{role}/" in n} == {0, 1, 2, 27, 28, 29}
    assert "/model/layers.0/attn/qkv_proj/MatMul" in types
    assert len(types) == 30 * 3 + 6 * 2


def test_target_options_put_names_first_then_the_algorithms_presets() -> None:
    recipe = RECIPES["q4km-like"]
    overrides = _overrides(target_options(recipe, recipe.builder_options(), SMOLLM2))
    names = [o["match"]["name"] for o in overrides if "name" in o["match"]]
    presets = [o["match"]["preset"] for o in overrides if "preset" in o["match"]]
    assert len(names) == 102
    # og 0.18: first match wins, and the list replaces k_quant_mixed's presets.
    assert overrides[len(names) :] == [
        {"match": {"preset": "last_matmul"}, "type": "int8"},
        {"match": {"preset": "mixed_layers"}, "type": "int8"},
    ]
    assert presets == ["last_matmul", "mixed_layers"]
    # A user's algo_config replaces the recipe's, and its presets with it.
    rtn = target_options(recipe, {**recipe.builder_options(), "algo_config": "rtn"}, SMOLLM2)
    assert all("name" in o["match"] for o in _overrides(rtn))


def test_legacy_presets_and_exclusions_are_kept_in_the_list() -> None:
    recipe = Recipe(algo_config="rtn", rules=[Rule(roles=["down"], layers=[0], type="int8")])
    options = {
        "algo_config": "k_quant",
        "matmul_mixed_precision": "last_matmul:int8",
        "nodes_to_exclude": "/model/layers.0/mlp/down_proj/MatMul",
    }
    assert _overrides(target_options(recipe, options, {"num_hidden_layers": 1})) == [
        {"match": {"name": "/model/layers.0/mlp/down_proj/MatMul"}, "exclude": True},
        {"match": {"preset": "last_matmul"}, "type": "int8"},
    ]


def test_a_tied_model_keeps_gather_among_the_quantized_op_types() -> None:
    recipe = RECIPES["q4km-like"]
    tied = target_options(recipe, recipe.builder_options(), SMOLLM2)
    assert tied is not None
    assert tied["quant_config"]["weights"]["op_types"] == ["MatMul", "Gather"]
    untied = target_options(recipe, {}, {"num_hidden_layers": 2, "tie_word_embeddings": False})
    assert untied is not None
    assert "op_types" not in untied["quant_config"]["weights"]
    not_shared = target_options(recipe, {"shared_embeddings": "false"}, SMOLLM2)
    assert not_shared is not None
    assert "op_types" not in not_shared["quant_config"]["weights"]


def test_a_recipe_without_rules_needs_no_target_options() -> None:
    recipe = RECIPES["k-quant-mixed"]
    assert target_options(recipe, recipe.builder_options(), SMOLLM2) is None
    # A CPU target adds the pruned lm_head (bake.targets) to the recipe's own options.
    assert {**recipe.builder_options(), "prune_lm_head": "true"} == builder_options(
        get_target("gcf"), "int4", {}
    )


def test_negative_indexes_and_ranges_count_from_the_last_layer() -> None:
    recipe = Recipe(rules=[Rule(roles=["down"], layers=[-1, "0..1", "-2..-1"], type="int8")])
    assert sorted(_layer(n) for n in node_types(recipe, 6)) == [0, 1, 4, 5]
    # Ranges are clipped to the model, as slices are: q4km-like bakes a 2-layer model.
    types = node_types(RECIPES["q4km-like"], 2)
    assert {_layer(n) for n in types if "/gate_proj/" in n} == {0, 1}


def test_a_later_rule_wins() -> None:
    recipe = Recipe(
        rules=[
            Rule(roles=["qkv", "o"], type="int8"),
            Rule(roles=["qkv"], layers=[0], type="int4"),
        ]
    )
    types = node_types(recipe, 2)
    assert types["/model/layers.0/attn/qkv_proj/MatMul"] == "int4"
    assert types["/model/layers.1/attn/qkv_proj/MatMul"] == "int8"
    assert types["/model/layers.0/attn/o_proj/MatMul"] == "int8"


def test_unfused_qkv_names_the_three_projections() -> None:
    recipe = Recipe(rules=[Rule(roles=["qkv"], layers=[0], type="int8")])
    options = target_options(recipe, {"disable_qkv_fusion": "true"}, {"num_hidden_layers": 1})
    names = {o["match"].get("name") for o in _overrides(options)}
    assert names == {f"/model/layers.0/attn/{p}_proj/MatMul" for p in "qkv"} | {None}


def test_a_layer_the_model_lacks_is_an_error() -> None:
    recipe = Recipe(rules=[Rule(roles=["down"], layers=[2], type="int8")])
    with pytest.raises(BakeError, match="layer 2 does not exist in a model of 2 layers"):
        node_types(recipe, 2)
    with pytest.raises(BakeError, match="layer -3 does not exist"):
        node_types(Recipe(rules=[Rule(roles=["o"], layers=[-3], type="int8")]), 2)
    with pytest.raises(BakeError, match="num_hidden_layers"):
        target_options(recipe, {}, {})


def test_recipe_files_json_and_toml(tmp_path: Path) -> None:
    data = {
        "algo_config": "k_quant_mixed",
        "block_size": 16,
        "rules": [
            {"roles": ["qkv", "o", "down"], "layers": "all", "type": "int8"},
            {"roles": ["gate", "up"], "layers": [0, 1, 2, -3, -2, -1], "type": "int8"},
        ],
    }
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    label, recipe = load_recipe(str(path))
    assert label == str(path)
    assert recipe.block_size == 16
    assert node_types(recipe, 30) == node_types(RECIPES["q4km-like"], 30)
    toml = tmp_path / "mine.toml"
    toml.write_text(
        'block_size = 16\n[[rules]]\nroles = ["qkv", "o", "down"]\ntype = "int8"\n'
        '[[rules]]\nroles = ["gate", "up"]\nlayers = ["0..2", "-3..-1"]\ntype = "int8"\n'
    )
    from_toml = load_recipe(str(toml))[1]
    assert from_toml.block_size == 16
    assert node_types(from_toml, 30) == node_types(recipe, 30)
    assert load_recipe("q4km-like") == ("q4km-like", RECIPES["q4km-like"])


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ('{"rules": [{"roles": ["attn"], "type": "int8"}]}', r"rules\.0\.roles\.0: Input should"),
        ('{"rules": [{"roles": ["o"], "type": "int2"}]}', r"rules\.0\.type: Input should be"),
        ('{"rules": [{"roles": [], "type": "int8"}]}', r"rules\.0\.roles: List should have at"),
        ('{"rules": [{"roles": ["o"], "layers": ["1-3"], "type": "int8"}]}', "not a layer range"),
        ('{"block_size": 24}', "power of two from 16 to 256"),
        ('{"algo_config": "gptq"}', "not one of og's algorithms"),
        ('{"accuracy_level": 7}', r"accuracy_level: Input should be less than or equal to 4"),
        ('{"layers": "all"}', r"layers: Extra inputs are not permitted"),
        ("{not json", "not valid json"),
    ],
)
def test_invalid_recipe_files_say_what_is_wrong(tmp_path: Path, content: str, error: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(BakeError, match=error):
        load_recipe(str(path))


def test_the_default_falls_back_where_the_names_may_not_exist() -> None:
    assert default_recipe("q4km-like", {"model_type": "llama"}) == "q4km-like"
    assert default_recipe("q4km-like", {"model_type": "qwen2"}) == "q4km-like"
    assert default_recipe("q4km-like", {"model_type": "phi"}) == "k-quant-mixed"
    assert default_recipe("k-quant-mixed", {"model_type": "phi"}) == "k-quant-mixed"


def test_the_cpu_targets_default_to_q4km_like() -> None:
    for name in ("gcf", "lambda-x86_64", "edge-aarch64", "cloudrun"):
        assert get_target(name).recipe == "q4km-like"
    assert get_target("cuda").recipe is None


def test_an_unknown_recipe_names_the_known_ones() -> None:
    with pytest.raises(BakeError, match="unknown recipe 'q4-best': name one of k-quant-mixed, "):
        load_recipe("q4-best")


def test_the_quality_benchmark_names_every_int4_variants_recipe(tmp_path: Path) -> None:
    """benchmarks.quality gives every option explicitly: the target's default recipe, with
    per-layer rules of its own, must not decide what a variant measures."""
    from benchmarks.quality import VARIANTS, bake_command

    def recipe(name: str) -> str | None:
        command = bake_command(VARIANTS[name], tmp_path, tmp_path / "out")
        return command[command.index("--recipe") + 1] if "--recipe" in command else None

    assert recipe("og-int4-b32-kq-mixed-int8tied") == "k-quant-mixed"
    assert recipe("og-recipe-q4km-like") == "q4km-like"
    assert recipe("og-int8-b128") is None

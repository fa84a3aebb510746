"""`ortserve bake --recipe`: per-layer int8 in the baked graph, the embedding kept tied."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import onnx
import pytest

from ortserve.bake.recipes import Recipe
from ortserve.core.manifest import Manifest
from tests.functional.bakehelp import bake_fails, bake_ok

# A user's recipe: og's default algorithm (k_quant_mixed: lm_head and llama.cpp's "mixed"
# layers int8; on 2 layers those are qkv and down_proj of both) plus its own rules.
RECIPE = {
    "description": "attention and down_proj int8, gate/up int8 in the last layer",
    "rules": [
        {"roles": ["qkv", "o", "down"], "layers": "all", "type": "int8"},
        {"roles": ["gate", "up"], "layers": [-1], "type": "int8"},
    ],
}
EIGHT_BIT = {
    *(f"/model/layers.{i}/attn/{p}/MatMul" for i in (0, 1) for p in ("qkv_proj", "o_proj")),
    *(f"/model/layers.{i}/mlp/down_proj/MatMul" for i in (0, 1)),
    "/model/layers.1/mlp/gate_proj/MatMul",
    "/model/layers.1/mlp/up_proj/MatMul",
    "/lm_head/MatMul",
}


@pytest.fixture(scope="module")
def tied_hf_dir(tiny_hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with its embedding tied to the lm_head, as SmolLM2's is."""
    folder = tmp_path_factory.mktemp("tied") / "hf"
    shutil.copytree(tiny_hf_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    return folder


@pytest.fixture(scope="module")
def recipe_bake(
    tied_hf_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Manifest, Path]:
    work = tmp_path_factory.mktemp("recipe")
    (work / "recipe.json").write_text(json.dumps(RECIPE))
    out = work / "out"
    manifest = bake_ok(
        "--model",
        str(tied_hf_dir),
        "--target",
        "edge-x86_64",
        "--model-only",
        "--no-smoke",
        "--recipe",
        str(work / "recipe.json"),
        out=out,
    )
    return manifest, out / "model"


def _nodes(model: Path) -> list[onnx.NodeProto]:
    return list(onnx.load(str(model / "model.onnx"), load_external_data=False).graph.node)


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.slow
def test_exactly_the_matmuls_the_recipe_names_are_8_bit(recipe_bake: tuple[Manifest, Path]) -> None:
    manifest, model = recipe_bake
    bits = {
        n.name.rsplit("_Q", 1)[0]: _attrs(n)["bits"]
        for n in _nodes(model)
        if n.op_type == "MatMulNBits"
    }
    assert len(bits) == 2 * 5 + 1  # every MatMul is quantized
    assert {name for name, b in bits.items() if b == 8} == EIGHT_BIT
    assert {name for name, b in bits.items() if b == 4} == {
        "/model/layers.0/mlp/gate_proj/MatMul",
        "/model/layers.0/mlp/up_proj/MatMul",
    }
    # The manifest keeps the file's recipe whole, defaults spelled out.
    assert Recipe.model_validate_json(manifest.builder_options["recipe"]) == Recipe.model_validate(
        RECIPE
    )
    assert manifest.builder_options["algo_config"] == "k_quant_mixed"


@pytest.mark.slow
def test_the_embedding_stays_tied_to_the_int8_lm_head(recipe_bake: tuple[Manifest, Path]) -> None:
    _, model = recipe_bake
    nodes = _nodes(model)
    (embedding,) = [n for n in nodes if n.name.startswith("/model/embed_tokens/Gather")]
    (head,) = [n for n in nodes if n.name.startswith("/lm_head/MatMul")]
    assert embedding.op_type == "GatherBlockQuantized"
    assert _attrs(embedding)["bits"] == 8
    # One weight for both: the embedding gathers from the lm_head's quantized tensors.
    assert set(embedding.input[2:]) <= set(head.input[1:])
    graph = onnx.load(str(model / "model.onnx"), load_external_data=False).graph
    assert not [i.name for i in graph.initializer if "embed_tokens" in i.name]


def test_recipe_errors(tied_hf_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    error = bake_fails(
        "--model", "builtin:tiny-llama", "--target", "gcf", "--recipe", "best", out=out
    )
    assert error.startswith("unknown recipe 'best': name one of k-quant-mixed, q4km-like, int8")
    error = bake_fails(
        "--model",
        "builtin:tiny-llama",
        "--target",
        "gcf",
        "--precision",
        "int8",
        "--recipe",
        "q4km-like",
        out=out,
    )
    assert "--recipe applies to int4 bakes" in error
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rules": [{"roles": ["down"], "layers": [5], "type": "int8"}]}))
    error = bake_fails(
        "--model", str(tied_hf_dir), "--target", "gcf", "--recipe", str(bad), out=out
    )
    assert error == "recipe: layer 5 does not exist in a model of 2 layers"


# `bake.upstream` run with `onnx_ir.to_proto` refusing a whole model: og's own `to_nbits`
# converts the whole graph (every weight in fp32) into one ModelProto, the streaming one
# converts one node at a time.
_GUARDED = """\
import sys
import onnx_ir
whole = onnx_ir.to_proto
def one_node_only(obj):
    if isinstance(obj, onnx_ir.Model) and len(obj.graph) > 1:
        raise SystemExit("the whole graph went through onnx_ir.to_proto")
    return whole(obj)
onnx_ir.to_proto = one_node_only
from ortserve.bake.upstream import main
sys.argv = ["ortserve.bake.upstream", *sys.argv[1:]]
main()
"""


def _initializers(model: Path) -> dict[str, bytes]:
    graph = onnx.load(str(model / "model.onnx")).graph
    return {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in graph.initializer}


@pytest.mark.slow
def test_the_streaming_quantizer_writes_the_builders_own_bytes(
    tied_hf_dir: Path, tmp_path: Path
) -> None:
    """What the bake runs (`bake.upstream`: one node quantized at a time) writes the same
    nodes and the same weights, byte for byte, as og's builder, for the default recipe
    (k_quant, int8 layers by exact name, og's presets, the tied embedding)."""
    import subprocess
    import sys

    from ortserve.bake.recipes import DEFAULT_RECIPE, RECIPES, target_options
    from ortserve.bake.targets import builder_options, get_target
    from ortserve.bake.upstream import BUILDER_MODULE

    assert BUILDER_MODULE == "ortserve.bake.upstream"  # what bake.pipeline runs
    config = json.loads((tied_hf_dir / "config.json").read_text())
    recipe = RECIPES[DEFAULT_RECIPE]
    # Without prune_lm_head: og's builder takes position -1 there, bake.upstream each
    # row's last (test_engine.py::test_a_pruned_lm_head_batches_prompts_of_different_...).
    options = builder_options(get_target("edge-x86_64"), "int4", {"prune_lm_head": "false"}, recipe)
    expanded = target_options(recipe, options, config)
    assert expanded is not None
    outputs = {}
    for name, runner in (
        ("og", ["-m", "onnxruntime_genai.models.builder"]),
        ("streaming", ["-c", _GUARDED]),
    ):
        outputs[name] = tmp_path / name
        proc = subprocess.run(
            [
                sys.executable,
                *runner,
                "-i",
                str(tied_hf_dir),
                "-o",
                str(outputs[name]),
                "-p",
                "int4",
                "-e",
                "cpu",
                "-c",
                str(tmp_path / f"cache-{name}"),
                "--extra_options",
                *(f"{k}={v}" for k, v in options.items()),
                "--target_options",
                json.dumps(expanded),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    og, streaming = _initializers(outputs["og"]), _initializers(outputs["streaming"])
    assert sorted(og) == sorted(streaming)
    assert [n for n in og if og[n] != streaming[n]] == []
    assert sorted(map(str, _nodes(outputs["og"]))) == sorted(map(str, _nodes(outputs["streaming"])))
    ops = {n.op_type for n in _nodes(outputs["streaming"])}
    assert {"MatMulNBits", "GatherBlockQuantized"} <= ops and "MatMul" not in ops

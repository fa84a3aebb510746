"""`ortserve bake` of the onnx-community layout: config and tokenizer at the top, one graph per
precision under onnx/; the variant chosen by the target's rule or by --onnx-file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest

from ortserve.core.engine import Engine, SamplingOptions
from ortserve.core.settings import EngineSettings
from tests import models
from tests.fakehub import FakeRepo, serve_fake_hub
from tests.functional.bakehelp import bake_fails, bake_ok, bake_ok_log

_SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def _greedy(model_dir: Path, prompt: str = "Edge boards run a daemon") -> list[int]:
    engine = Engine.load(EngineSettings(model_dir=model_dir, providers="cpu"))
    return list(engine.stream_tokens(engine.encode(prompt), SamplingOptions(16, 16)))


def _fetched(requests: list[tuple[str, str, str | None]]) -> set[str]:
    """The repo files downloaded: GET /{repo}/resolve/{revision}/{path}."""
    paths = (p.split("/resolve/", 1) for m, p, _ in requests if m == "GET")
    return {parts[1].split("/", 1)[1] for parts in paths if len(parts) == 2}


def _add_graph(baked: Path, dst: Path, name: str, data_name: str) -> None:
    """Copy a baked model.onnx as `dst/name`, its weights as `data_name` (and say so inside)."""
    model = onnx.load(str(baked / "model.onnx"), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = data_name
    dst.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst / name))
    shutil.copy(baked / "model.onnx.data", dst / data_name)


@pytest.fixture(scope="module")
def tiny_q4_dir() -> Path:
    """The tiny model baked with mostly 4-bit weights (`--recipe k-quant-mixed`): the
    default recipe, q4km-like, makes every MatMul of a 2-layer model 8-bit."""
    bundle = models.baked("builtin:tiny-llama", package=False, extra=("--recipe", "k-quant-mixed"))
    return bundle / "model"


@pytest.fixture(scope="module")
def community_dir(
    tiny_hf_dir: Path,
    tiny_q4_dir: Path,
    tiny_fp32_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The tiny model as onnx-community publishes one: fp32 model.onnx, int4 model_q4.onnx."""
    folder = tmp_path_factory.mktemp("onnx-community")
    for name in _SMALL_FILES:
        shutil.copy(tiny_hf_dir / name, folder / name)
    (folder / "README.md").write_text("# tiny, ONNX\n")
    _add_graph(tiny_fp32_dir, folder / "onnx", "model.onnx", "model.onnx_data")
    _add_graph(tiny_q4_dir, folder / "onnx", "model_q4.onnx", "model_q4.onnx_data")
    # Another variant, never the default on CPU, never fetched then.
    _add_graph(tiny_fp32_dir, folder / "onnx", "model_fp16.onnx", "model_fp16.onnx_data")
    return folder


@pytest.mark.slow
def test_default_variant_on_cpu_is_q4_and_the_bake_says_so(
    community_dir: Path, tiny_q4_dir: Path, tmp_path: Path
) -> None:
    manifest, log = bake_ok_log(
        "--model",
        str(community_dir),
        "--target",
        "edge-x86_64",
        "--model-only",
        out=tmp_path / "m",
    )
    assert "[bake] ONNX variant: onnx/model_q4.onnx (4-bit weights, fp32 activations" in log
    assert manifest.source_kind == "onnx"
    assert manifest.precision.startswith("int4") and manifest.precision.endswith("(as exported)")
    assert "builder" not in manifest.builder_version
    assert manifest.builder_options == {}
    files = sorted(f.path for f in manifest.files)
    # The graph and its data, the small files of the export, and what transformers adds
    # to raw text (core/text.py).
    assert files == [
        "genai_config.json",
        "model.onnx",
        "model.onnx.data",
        "ortserve-text.json",
        *_SMALL_FILES[2:],
    ]
    config = json.loads((tmp_path / "m" / "model" / "genai_config.json").read_text())
    assert config["model"]["decoder"]["filename"] == "model.onnx"
    assert config["model"]["type"] == "llama"
    assert _greedy(tmp_path / "m" / "model") == _greedy(tiny_q4_dir)


@pytest.mark.slow
def test_onnx_file_picks_another_variant(
    community_dir: Path, tiny_fp32_dir: Path, tmp_path: Path
) -> None:
    manifest, log = bake_ok_log(
        "--model",
        str(community_dir),
        "--onnx-file",
        "onnx/model.onnx",
        "--target",
        "gcf",
        "--model-only",
        out=tmp_path / "m",
    )
    assert "[bake] ONNX variant: onnx/model.onnx (chosen with --onnx-file)" in log
    assert manifest.precision == "fp32 (as exported)"
    assert _greedy(tmp_path / "m" / "model") == _greedy(tiny_fp32_dir)


@pytest.mark.slow
def test_precision_int4_quantizes_an_fp32_graph(community_dir: Path, tmp_path: Path) -> None:
    manifest, log = bake_ok_log(
        "--model",
        str(community_dir),
        "--onnx-file",
        "onnx/model.onnx",
        "--precision",
        "int4",
        "--block-size",
        "32",
        "--target",
        "edge-x86_64",
        "--model-only",
        out=tmp_path / "m",
    )
    assert "quantizing onnx/model.onnx to int4 with onnxruntime's MatMulNBitsQuantizer" in log
    assert manifest.precision == "int4"
    assert manifest.builder_options == {"block_size": "32", "accuracy_level": "4"}
    assert manifest.builder_version.startswith("onnxruntime.quantization MatMulNBitsQuantizer")
    graph = onnx.load(str(tmp_path / "m" / "model" / "model.onnx"), load_external_data=False)
    assert sum(node.op_type == "MatMulNBits" for node in graph.graph.node) >= 8
    tokens = _greedy(tmp_path / "m" / "model")
    assert len(tokens) == 16
    assert all(0 <= t < 512 for t in tokens)


@pytest.mark.slow
def test_options_that_cannot_apply_to_the_graph_are_refused(
    community_dir: Path, tmp_path: Path
) -> None:
    args = ("--model", str(community_dir), "--target", "gcf")
    message = bake_fails(*args, "--precision", "int4", out=tmp_path / "x")
    assert "onnx/model_q4.onnx is already int4" in message
    assert "--onnx-file" in message
    message = bake_fails(*args, "--block-size", "32", out=tmp_path / "x")
    assert "need --precision int4 or int8" in message
    message = bake_fails(*args, "--builder-option", "int4_algo_config=k_quant", out=tmp_path / "x")
    assert "applies to checkpoints" in message
    message = bake_fails(*args, "--onnx-file", "onnx/model_q8.onnx", out=tmp_path / "x")
    assert "no such graph" in message
    assert "onnx/model_q4.onnx" in message
    message = bake_fails(
        "--model", str(community_dir / "onnx"), "--target", "gcf", out=tmp_path / "x"
    )
    assert f"give the export's top folder ({community_dir})" in message


@pytest.mark.slow
def test_flat_folder_with_two_graphs_needs_onnx_file(
    community_dir: Path, tiny_q4_dir: Path, tmp_path: Path
) -> None:
    flat = tmp_path / "flat"
    shutil.copytree(community_dir / "onnx", flat, ignore=shutil.ignore_patterns("*fp16*"))
    for name in _SMALL_FILES:
        shutil.copy(community_dir / name, flat / name)
    message = bake_fails("--model", str(flat), "--target", "gcf", out=tmp_path / "x")
    assert "model.onnx, model_q4.onnx" in message
    assert "--onnx-file" in message
    bake_ok(
        "--model",
        str(flat),
        "--onnx-file",
        "model_q4.onnx",
        "--target",
        "gcf",
        "--model-only",
        out=tmp_path / "m",
    )
    assert _greedy(tmp_path / "m" / "model") == _greedy(tiny_q4_dir)


@pytest.mark.slow
def test_model_families_beyond_llama_are_inferred_and_others_named(
    community_dir: Path, tiny_q4_dir: Path, tmp_path: Path
) -> None:
    src = tmp_path / "qwen3"
    shutil.copytree(community_dir, src, ignore=shutil.ignore_patterns("model.onnx*", "*fp16*"))
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "model_type": "qwen3"}))
    bake_ok("--model", str(src), "--target", "gcf", "--model-only", out=tmp_path / "m")
    genai = json.loads((tmp_path / "m" / "model" / "genai_config.json").read_text())
    assert genai["model"]["type"] == "qwen3"
    assert _greedy(tmp_path / "m" / "model") == _greedy(tiny_q4_dir)
    (src / "config.json").write_text(json.dumps({**config, "model_type": "starcoder2"}))
    message = bake_fails("--model", str(src), "--target", "gcf", out=tmp_path / "x")
    assert "model_type 'starcoder2'" in message
    assert "gemma2" in message
    assert "qwen3" in message


@pytest.mark.slow
def test_hub_fetches_only_the_chosen_variant(
    community_dir: Path, tiny_q4_dir: Path, tiny_fp32_dir: Path, tmp_path: Path
) -> None:
    repos = {"onnx-community/tiny-llama-ONNX": FakeRepo(revisions={"main": community_dir})}
    with serve_fake_hub(repos) as hub:
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf")}
        args = ("--model", "onnx-community/tiny-llama-ONNX", "--target", "edge-x86_64")
        manifest, log = bake_ok_log(*args, "--model-only", out=tmp_path / "m", env=env)
        assert "[bake] ONNX variant: onnx/model_q4.onnx (4-bit weights" in log
        assert manifest.source_kind == "hub"
        fetched = _fetched(hub.requests)
        assert {"onnx/model_q4.onnx", "onnx/model_q4.onnx_data", "config.json"} <= fetched
        assert (
            not {
                "onnx/model.onnx",
                "onnx/model.onnx_data",
                "onnx/model_fp16.onnx",
                "onnx/model_fp16.onnx_data",
                "README.md",
            }
            & fetched
        )
        assert _greedy(tmp_path / "m" / "model") == _greedy(tiny_q4_dir)

        seen = len(hub.requests)
        bake_ok(
            *args, "--onnx-file", "onnx/model.onnx", "--model-only", out=tmp_path / "f", env=env
        )
        fetched = _fetched(hub.requests[seen:])
        assert {"onnx/model.onnx", "onnx/model.onnx_data"} <= fetched
        assert not any("fp16" in p for p in fetched)
        assert _greedy(tmp_path / "f" / "model") == _greedy(tiny_fp32_dir)

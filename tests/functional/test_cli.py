"""The `ortserve` command as a user meets it: version, help, completion, bad invocations."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.support.servers import ORTSERVE, free_port
from tests.functional.harness import SERVER_ENV
from tests.models import SOURCE_CACHE, run_ortserve


def test_version_names_ortserve_and_its_runtime() -> None:
    proc = run_ortserve("--version")
    assert proc.returncode == 0
    assert re.fullmatch(r"ortserve \S+ \(onnxruntime-genai \d+\.\d+\.\d+\)\n", proc.stdout)


def test_help_lists_the_commands_and_each_option_says_its_default() -> None:
    top = run_ortserve("--help").stdout
    for command in ("generate", "probe", "bake", "serve", "completion"):
        assert re.search(rf"^\s+{command}\s", top, re.MULTILINE), command
    assert "entry-point" not in top  # the plugin mechanism is not a user's business
    generate = run_ortserve("generate", "--help").stdout
    assert "(default: 64)" in generate and "0 is greedy (default: 0.0)" in generate


def test_completion_scripts() -> None:
    for shell in ("bash", "zsh"):
        proc = run_ortserve("completion", shell)
        assert proc.returncode == 0, proc.stderr
        for word in ("generate", "bake", "serve", "--max-new-tokens"):
            assert word in proc.stdout, (shell, word)


def test_bad_invocations_get_one_clear_line(tiny_gcf_bundle: Path) -> None:
    bad = run_ortserve("generate", "--max-new-tokens", "-5", "hi")
    assert bad.returncode == 2
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .endswith("argument --max-new-tokens: must be at least 1, got -5")
    )
    assert "KV cache" not in bad.stderr
    bundle = run_ortserve("generate", "--model-dir", str(tiny_gcf_bundle), "hi")
    assert bundle.returncode == 1
    lines = bundle.stderr.strip().splitlines()
    assert len(lines) == 1 and "its model folder is" in lines[0], bundle.stderr
    assert str(tiny_gcf_bundle / "model") in lines[0]


def _run_until_ready(cmd: list[str], env: dict[str, str], port: int) -> str:
    """Start `cmd`, wait for /readyz on `port`, SIGTERM it; its stderr."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        ready = False
        while time.monotonic() < deadline and proc.poll() is None and not ready:
            with contextlib.suppress(httpx.HTTPError):
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
            time.sleep(0.1)
        assert ready, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        proc.kill()
    return err


def _serve_log(model_dir: Path, level: str) -> str:
    """stderr of `ortserve serve` from start to a SIGTERM once it is ready."""
    port = free_port()
    env = {**os.environ, **SERVER_ENV, "ORTSERVE_LOG_LEVEL": level, "ORTSERVE_PROVIDERS": "auto"}
    cmd = [*ORTSERVE, "serve", "--model-dir", str(model_dir), "--port", str(port)]
    return _run_until_ready(cmd, env, port)


def test_daemon_log_lines_carry_time_and_level(tiny_model_dir: Path) -> None:
    lines = _serve_log(tiny_model_dir, "info").strip().splitlines()
    stamp = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) ")
    assert lines and all(stamp.match(line) for line in lines), lines
    ready = next(line for line in lines if " ready on " in line)
    # Readable: providers and reasons in words, not a Python dict.
    assert "{" not in ready and "other providers skipped: cuda (" in ready, ready
    quiet = _serve_log(tiny_model_dir, "WARNING")
    assert " INFO " not in quiet, quiet


@pytest.mark.slow
def test_run_with_a_recipe_is_another_stored_bake(tmp_path: Path) -> None:
    env = {**os.environ, **SERVER_ENV, "ORTSERVE_HOME": str(tmp_path / "home"),
           "ORTSERVE_CACHE_DIR": str(SOURCE_CACHE)}  # fmt: skip
    port = free_port()
    run = [*ORTSERVE, "run", "builtin:tiny-llama", "--port", str(port)]
    assert "baking" in _run_until_ready([*run, "--recipe", "k-quant-mixed"], env, port)
    assert "is in the store" in _run_until_ready([*run, "--recipe", "k-quant-mixed"], env, port)
    assert "baking" in _run_until_ready(run, env, port)
    manifests = sorted((tmp_path / "home" / "models").glob("*/model/manifest.json"))
    recipes = sorted(json.loads(p.read_text())["builder_options"]["recipe"] for p in manifests)
    assert recipes == ["k-quant-mixed", "q4km-like"]
    bad = subprocess.run([*run, "--recipe", "best"], env=env, capture_output=True, text=True,
                         check=False)  # fmt: skip
    assert bad.returncode == 1 and "unknown recipe 'best'" in bad.stderr


@pytest.mark.slow
def test_run_bakes_once_into_the_store_then_list_show_serve_rm(tmp_path: Path) -> None:
    env = {**os.environ, **SERVER_ENV, "ORTSERVE_HOME": str(tmp_path / "home"),
           "ORTSERVE_CACHE_DIR": str(SOURCE_CACHE)}  # fmt: skip
    port = free_port()
    run = [*ORTSERVE, "run", "builtin:tiny-llama", "--port", str(port)]
    first = _run_until_ready(run, env, port)
    assert "ortserve run: baking builtin:tiny-llama" in first
    second = _run_until_ready(run, env, port)
    assert "is in the store" in second and "baking" not in second
    listed = run_ortserve("list", env=env).stdout.splitlines()
    assert listed[0].split()[:4] == ["NAME", "TARGET", "PRECISION", "SIZE"]
    (row,) = listed[1:]
    name = row.split()[0]
    assert name.startswith("tiny-llama-edge-") and "int4" in row and "random weights" in row
    shown = run_ortserve("show", "tiny-llama", env=env)
    assert shown.returncode == 0 and "quality:" in shown.stdout, shown.stderr
    serve = [*ORTSERVE, "serve", "--model-dir", name, "--port", str(port)]
    _run_until_ready(serve, env, port)
    assert run_ortserve("rm", name, env=env).stdout.strip() == f"removed {name}"
    assert "no models in" in run_ortserve("list", env=env).stdout
    missing = run_ortserve("rm", name, env=env)
    assert missing.returncode == 1 and "no stored model" in missing.stderr

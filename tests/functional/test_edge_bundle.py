"""The edge bundle end to end: bake → install.sh → the installed daemon answers the host.

The aarch64 bundle is installed and served under qemu user-mode emulation (an arm64
Debian python3.11; see tests/edge_bundle_qemu.py), the x86_64 one natively. Both run
install.sh with --prefix and --no-systemd, start the daemon exactly as the installed
unit would (its ExecStart, Environment= and EnvironmentFile=), and ask it from the host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.support.servers import free_port
from ortserve.bake.errors import BakeError
from ortserve.bake.package_edge import package_edge
from ortserve.bake.targets import get_target
from ortserve.core import playground
from tests import edge_bundle_qemu as emu
from tests import models
from tests.edge_bundle_kit import (
    ENV_REL,
    MODEL_REL,
    UNIT_REL,
    VENV_REL,
    Stopwatch,
    copy_bundle,
    edge_bundle,
    fake_python,
    install,
    listing,
    replace_file,
    serve_installed,
)
from tests.tools import tool

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def aarch64_python() -> Path:
    """The emulated aarch64 python3.11 (a host script that runs it under qemu)."""
    try:
        return emu.python(emu.aarch64_root())
    except emu.QemuUnavailable as exc:
        pytest.skip(f"no aarch64 emulation here: {exc}")


@pytest.fixture(scope="module")
def aarch64_bundle() -> Path:
    """The tiny model's edge-aarch64 bundle."""
    return edge_bundle("edge-aarch64")


@pytest.fixture(scope="module")
def x86_64_bundle() -> Path:
    """The tiny model's edge-x86_64 bundle."""
    return edge_bundle("edge-x86_64")


def _sse(body: bytes) -> list[Any]:
    events: list[Any] = []
    for block in body.decode().split("\n\n"):
        if block.strip():
            data = block.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _ask(url: str) -> dict[str, float]:
    """/readyz, a /generate and a streamed chat completion, as a user's client would;
    returns how long each took."""
    timings: dict[str, float] = {}
    with httpx.Client(base_url=url, timeout=120) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["execution_provider"] == "cpu"
        model = ready.json()["model"]
        # The playground's vendored script came in the ortserve wheel (package data).
        script = client.get("/vendor/purify.min.js")
        assert script.status_code == 200
        assert (
            script.content
            == (Path(playground.__file__).parent / "vendor/purify.min.js").read_bytes()
        )

        clock = Stopwatch()
        reply = client.post("/generate", json={"prompt": "Hello", "max_new_tokens": 16})
        timings["generate_16_tokens_s"] = clock()
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["generated_text"]
        assert 1 <= body["tokens_generated"] <= 16
        assert body["finish_reason"] in ("length", "stop")

        chat = {
            "model": model,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 8,
            "stream": True,
        }
        clock = Stopwatch()
        with client.stream("POST", "/v1/chat/completions", json=chat) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            chunks = list(stream.iter_raw())
        timings["chat_stream_8_tokens_s"] = clock()
    events = _sse(b"".join(chunks))
    assert events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"]]
    assert "".join(deltas), events
    assert events[-2]["choices"][0]["finish_reason"] in ("length", "stop")
    return timings


def _install_serve_uninstall(
    bundle: Path, python: Path, prefix: Path, env: dict[str, str] | None = None
) -> dict[str, float]:
    """`env`: install.sh's environment (None: this process's). Installs a copy of
    `bundle` (outside the checkout) from its own folder, then again from an unrelated one."""
    timings: dict[str, float] = {}
    bundle = copy_bundle(bundle, prefix.parent / "bundle-copy")
    clock = Stopwatch()
    first = install(
        bundle, "--prefix", str(prefix), "--python", str(python), "--no-systemd", env=env
    )
    timings["install_s"] = clock()
    assert first.returncode == 0, first.stdout + first.stderr
    assert "checks passed" in first.stdout
    assert f"ORTSERVE_MODEL_DIR={prefix}/{MODEL_REL}" in first.stdout  # how to start by hand
    assert (prefix / VENV_REL / "bin" / "ortserve").is_file()
    assert (prefix / MODEL_REL / "manifest.json").is_file()
    unit = (prefix / UNIT_REL).read_text(encoding="utf-8")
    assert f"ExecStart={prefix}/{VENV_REL}/bin/ortserve serve\n" in unit
    assert f"EnvironmentFile=-{prefix}/{ENV_REL}\n" in unit
    assert (prefix / ENV_REL).stat().st_mode & 0o777 == 0o600
    # The rewritten unit is still valid (ExecStart must exist and be executable).
    verify = subprocess.run(
        [tool("systemd-analyze"), "verify", str(prefix / UNIT_REL)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout + verify.stderr == ""

    # Idempotent: a second run verifies and changes nothing at all.
    before = listing(prefix)
    clock = Stopwatch()
    elsewhere = prefix.parent / "elsewhere"
    elsewhere.mkdir()
    second = install(
        bundle,
        *("--prefix", str(prefix), "--python", str(python), "--no-systemd"),
        env=env,
        cwd=elsewhere,
    )
    timings["second_install_s"] = clock()
    assert second.returncode == 0, second.stdout + second.stderr
    assert "already installed: nothing changed" in second.stdout
    assert listing(prefix) == before

    # Settings the operator wrote survive a reinstall of a changed bundle.
    (prefix / ENV_REL).write_text("ORTSERVE_MAX_NEW_TOKENS=64\n", encoding="utf-8")

    clock = Stopwatch()
    with serve_installed(prefix, free_port()) as url:
        timings["daemon_ready_s"] = clock()
        timings.update(_ask(url))

    gone = install(bundle, "--uninstall", "--prefix", str(prefix), "--no-systemd", env=env)
    assert gone.returncode == 0, gone.stderr
    assert not (prefix / "opt" / "ortserve").exists()
    assert not (prefix / MODEL_REL).exists()
    assert not (prefix / UNIT_REL).exists()
    assert (prefix / ENV_REL).read_text(encoding="utf-8") == "ORTSERVE_MAX_NEW_TOKENS=64\n"
    return timings


def _report(name: str, timings: dict[str, float], bundle: Path) -> None:
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    parts = ", ".join(f"{k} {v:.1f}" for k, v in timings.items())
    print(f"\n[{name}] bundle {size / 1e6:.0f} MB; {parts}")


def test_aarch64_bundle_installs_and_serves_under_emulation(
    aarch64_python: Path, aarch64_bundle: Path, tmp_path: Path
) -> None:
    # pip's byte-compiling of the venv's ~2,300 modules was half of the install under
    # qemu (~45 s). Bytecode is the same on every architecture, and the x86_64 test
    # below has pip compile the same modules with the same CPython minor version; what
    # is aarch64's own (the wheels' native code) is still imported and served here.
    # install.sh's import check then writes the bytecode of what the daemon imports
    # (whatever PYTHONDONTWRITEBYTECODE the tests run with), which the daemon reuses.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PIP_COMPILE"] = "0"  # not PIP_NO_COMPILE=1: pip reads that one inverted
    timings = _install_serve_uninstall(aarch64_bundle, aarch64_python, tmp_path / "prefix", env)
    _report("edge-aarch64 under qemu", timings, aarch64_bundle)


def test_x86_64_bundle_installs_and_serves_natively(x86_64_bundle: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    timings = _install_serve_uninstall(x86_64_bundle, Path(sys.executable), prefix)
    _report("edge-x86_64 native", timings, x86_64_bundle)


def test_an_aarch64_bundle_is_refused_on_x86_64(aarch64_bundle: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    proc = install(aarch64_bundle, "--prefix", str(prefix), "--python", sys.executable)
    assert proc.returncode == 1
    assert f"this bundle is for aarch64, but {sys.executable} runs on x86_64" in proc.stderr
    assert not prefix.exists()


def test_an_x86_64_bundle_is_refused_on_emulated_aarch64(
    aarch64_python: Path, x86_64_bundle: Path, tmp_path: Path
) -> None:
    prefix = tmp_path / "prefix"
    proc = install(x86_64_bundle, "--prefix", str(prefix), "--python", str(aarch64_python))
    assert proc.returncode == 1
    assert f"this bundle is for x86_64, but {aarch64_python} runs on aarch64" in proc.stderr
    assert "--target edge-aarch64" in proc.stderr
    assert not prefix.exists()


def test_python_3_10_is_refused(x86_64_bundle: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    python = fake_python(tmp_path / "bin", "x86_64 64 3.10 glibc-2.36")
    proc = install(x86_64_bundle, "--prefix", str(prefix), "--python", str(python))
    assert proc.returncode == 1
    assert f"Python 3.10 ({python}) is too old: ortserve needs Python >= 3.11" in proc.stderr
    assert not prefix.exists()


def test_a_tampered_bundle_is_refused(x86_64_bundle: Path, tmp_path: Path) -> None:
    bundle = copy_bundle(x86_64_bundle, tmp_path / "bundle")
    wheel = next((bundle / "wheels").glob("onnxruntime_genai-*.whl"))
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit in the middle of the native runtime
    replace_file(wheel, bytes(data))
    prefix = tmp_path / "prefix"
    proc = install(bundle, "--prefix", str(prefix), "--python", sys.executable)
    assert proc.returncode == 1
    assert f"wheels/{wheel.name}: FAILED" in proc.stderr
    assert not prefix.exists()


def test_the_bundle_carries_what_install_sh_needs(aarch64_bundle: Path) -> None:
    names = sorted(p.name for p in (aarch64_bundle / "wheels").glob("*.whl"))
    for dist in ("onnxruntime_genai-0.18.0", "onnxruntime-", "numpy-", "pydantic_core-"):
        for python in ("cp311", "cp312", "cp313", "cp314"):
            assert any(
                n.startswith(dist) and f"-{python}-" in n and "aarch64" in n for n in names
            ), (dist, python, names)
    for pure in ("ortserve-", "uvicorn-", "prometheus_client-", "pip-", "h11-", "click-"):
        assert any(n.startswith(pure) for n in names), (pure, names)
    assert not [n for n in names if "x86_64" in n]
    info = (aarch64_bundle / "BUNDLE-INFO").read_text(encoding="utf-8")
    assert "arch=aarch64\n" in info
    assert "python=3.11 3.12 3.13 3.14\n" in info
    subprocess.run(
        ["sha256sum", "-c", "--quiet", "--strict", "BUNDLE-MANIFEST.sha256"],
        cwd=aarch64_bundle,
        check=True,
    )


def test_the_bake_cli_writes_the_bundle() -> None:
    # Through the real `ortserve bake --target edge-aarch64`.
    bundle = models.baked("builtin:tiny-llama", target="edge-aarch64")
    for name in ("install.sh", "ortserve.service", "ortserve.env", "BUNDLE-INFO", "wheels"):
        assert (bundle / name).exists(), name
    subprocess.run(
        ["sha256sum", "-c", "--quiet", "--strict", "BUNDLE-MANIFEST.sha256"], cwd=bundle, check=True
    )


def test_a_bake_without_network_or_cache_fails_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An index nobody listens on stands for "no network"; an empty cache for "never baked".
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{free_port()}/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no configured mirrors or find-links
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(name, raising=False)
    bundle = tmp_path / "bundle"
    (bundle / "model").mkdir(parents=True)
    cache = tmp_path / "cache"
    with pytest.raises(BakeError) as caught:
        package_edge(get_target("edge-aarch64"), bundle, cache=cache)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("cannot download the aarch64 wheels for Python 3.11: ")
    assert "no network" in message
    assert f"access to PyPI (or a mirror in PIP_INDEX_URL) to fill the cache in {cache}" in message
    assert [p.name for p in cache.iterdir()] == [], "no half-filled cache is left behind"

"""Helpers for tests that run `ortserve bake` and check what it leaves behind."""

from __future__ import annotations

import shutil
from pathlib import Path

from core.manifest import Manifest, read_manifest
from tests.models import run_ortserve


def bake_ok(*args: str, out: Path, env: dict[str, str] | None = None) -> Manifest:
    """Run a bake that must succeed; return the manifest of the model it wrote."""
    proc = run_ortserve("bake", *args, "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(out.resolve())
    return read_manifest(out / "model")


def bake_fails(*args: str, out: Path, env: dict[str, str] | None = None) -> str:
    """Run a bake that must fail cleanly; return its one-line error message."""
    proc = run_ortserve("bake", *args, "--out", str(out), env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ortserve bake: error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not out.exists(), "a failed bake left its output folder"
    leftovers = [p.name for p in out.parent.glob(f".{out.name}.partial-*")]
    assert not leftovers, f"a failed bake left {leftovers}"
    return last.removeprefix("ortserve bake: error: ")


def copy_without(src: Path, dst: Path, *skip: str) -> Path:
    """Copy a model folder, leaving out the named files."""
    shutil.copytree(src, dst, ignore=lambda _d, names: [n for n in names if n in skip])
    return dst


def bake_ok_log(*args: str, out: Path, env: dict[str, str] | None = None) -> tuple[Manifest, str]:
    """Run a bake that must succeed; return the manifest and the bake's progress output."""
    proc = run_ortserve("bake", *args, "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(out.resolve())
    return read_manifest(out / "model"), proc.stderr

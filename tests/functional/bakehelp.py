"""Helpers for tests that run `ortserve bake` and check what it leaves behind."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ortserve.core.manifest import Manifest, read_manifest
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


# A line of a locked requirements file (bake.lock): pinned and hashed.
LOCKED = re.compile(r"(?P<name>[a-z0-9\-]+)==(?P<version>[0-9][^= ]*) --hash=sha256:[0-9a-f]{64}")


def locked_pins(path: Path) -> dict[str, str]:
    """name -> version of a locked requirements file, whose every line must be pinned and
    hashed."""
    lines = path.read_text().splitlines()
    matches = [LOCKED.fullmatch(line) for line in lines]
    assert all(matches), [line for line, m in zip(lines, matches, strict=True) if not m]
    return {m["name"]: m["version"] for m in matches if m}


def hash_checked_install(
    requirements: Path, arch: str, glibc_minor: int, work: Path
) -> dict[str, str]:
    """What pip installs from `requirements` for CPython 3.12 on Linux `arch` with glibc
    2.`glibc_minor` (name -> version), in hash-checking mode as an image's or a buildpack's
    pip would (a dry run against the index; skips where the index is not reachable)."""
    from ortserve.bake.lock import manylinux_tags

    report = work / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--require-hashes",
            "--only-binary=:all:",
            "--quiet",
            *(f"--platform={tag}" for tag in manylinux_tags(arch, glibc_minor)),
            "--python-version=3.12",
            "--implementation=cp",
            "--abi=cp312",
            "--target",
            str(work / "t"),
            "--report",
            str(report),
            "-r",
            str(requirements),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0 and "NewConnectionError" in proc.stderr:
        pytest.skip("the package index is not reachable")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }

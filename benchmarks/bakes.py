"""Bake outputs the benchmarks run on, made with the real `ortserve bake` when missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def baked(work: Path, model: str, target: str) -> Path:
    """The bake output (a bundle; the model is in `model/`) of `model` for `target`."""
    out = work / f"{model.removeprefix('builtin:').replace('/', '--')}-{target}"
    if not (out / "model" / "manifest.json").is_file():
        subprocess.run(
            [str(Path(sys.executable).parent / "ortserve"), "bake", "--model", model,
             "--target", target, "--out", str(out), "--force"],
            check=True,
        )  # fmt: skip
    return out

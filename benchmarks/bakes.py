"""Bake outputs the benchmarks run on, made with the real `ortserve bake` when missing."""

from __future__ import annotations

import subprocess
from pathlib import Path

from benchmarks.support.servers import ORTSERVE


def baked(work: Path, model: str, target: str, package: bool = True) -> Path:
    """The bake output (a bundle; the model is in `model/`) of `model` for `target`.

    `package=False` bakes the model only (`--model-only`: no wheelhouse to download) when
    the folder is missing; a packaged folder already there serves as well.
    """
    out = work / f"{model.removeprefix('builtin:').replace('/', '--')}-{target}"
    if not (out / "model" / "manifest.json").is_file():
        command = [
            *ORTSERVE,
            "bake",
            "--model",
            model,
            "--target",
            target,
            "--out",
            str(out),
            "--force",
        ]
        subprocess.run(command + ([] if package else ["--model-only"]), check=True)
    return out

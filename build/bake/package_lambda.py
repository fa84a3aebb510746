"""Lambda packaging: the bake output becomes the Docker build context of both images.

`ortserve bake --target lambda-x86_64|lambda-arm64 --out DIR` leaves DIR with the model
in `model/` and, from here: `Dockerfile` (buffered handler) and `Dockerfile.stream`
(edge daemon behind the Lambda Web Adapter), their pinned requirements, and the runtime
code they copy (`core/`, `functions/aws/`, `edge/`). template.yaml's Metadata points
`sam build` at that folder.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from bake.package import RUNTIME_DISTRIBUTIONS, copy_runtime_code, pinned
from bake.targets import Target

DOCKERFILES = ("Dockerfile", "Dockerfile.stream")
# onnxruntime-genai's own runtime dependency, pinned too: the image must be the tested set.
LAMBDA_DISTRIBUTIONS = (*RUNTIME_DISTRIBUTIONS, "onnxruntime")
# The edge daemon's dependencies (the `edge` extra), for the streaming image.
STREAM_DISTRIBUTIONS = ("uvicorn", "h11", "click", "prometheus-client")
# Versions this project was tested with, for the edge packages a bake machine may lack.
_TESTED = {"uvicorn": "0.54.0", "h11": "0.16.0", "click": "8.5.1", "prometheus-client": "0.26.0"}


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {name} is not importable: is ortserve installed?")
    return Path(next(iter(spec.submodule_search_locations)))


def _pins(distributions: tuple[str, ...]) -> list[str]:
    lines = []
    for dist in distributions:
        try:
            lines.extend(pinned((dist,)))
        except KeyError:  # not installed here and unknown to bake.package
            lines.append(f"{dist}=={_TESTED[dist]}")
    return lines


def _write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def package_lambda(target: Target, bundle: Path) -> None:
    """Add the Lambda images' Dockerfiles, requirements and runtime code around `bundle/model`."""
    if not target.name.startswith("lambda-"):
        raise ValueError(f"{target.name} is not a Lambda target")
    copy_runtime_code(bundle, ("aws",))
    shutil.copytree(
        _package_dir("edge"), bundle / "edge", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    aws = _package_dir("functions") / "aws"
    for name in DOCKERFILES:
        shutil.copy2(aws / name, bundle / name)
    runtime = _pins(LAMBDA_DISTRIBUTIONS)
    _write_lines(bundle / "requirements.txt", runtime)
    _write_lines(bundle / "requirements-stream.txt", runtime + _pins(STREAM_DISTRIBUTIONS))

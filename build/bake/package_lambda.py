"""Lambda packaging: the bake output becomes the Docker build context of both images.

`ortserve bake --target lambda-x86_64|lambda-arm64 --out DIR` leaves DIR with the model
in `model/` and, from here: `Dockerfile` (buffered handler) and `Dockerfile.stream`
(edge daemon behind the Lambda Web Adapter), their pinned requirements, and the runtime
code they copy (`core/`, `functions/aws/`, `edge/`). template.yaml's Metadata points
`sam build` at that folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bake.packaging_common import (
    IGNORE,
    RUNTIME_DISTRIBUTIONS,
    copy_runtime_code,
    package_dir,
    pinned,
    write_lines,
)
from bake.targets import Target

DOCKERFILES = ("Dockerfile", "Dockerfile.stream")
# onnxruntime-genai's own runtime dependency, pinned too: the image must be the tested set.
LAMBDA_DISTRIBUTIONS = (*RUNTIME_DISTRIBUTIONS, "onnxruntime")
# The edge daemon's dependencies (the `edge` extra), for the streaming image.
STREAM_DISTRIBUTIONS = ("uvicorn", "h11", "click", "prometheus-client")


def package_lambda(target: Target, bundle: Path) -> None:
    """Add the Lambda images' Dockerfiles, requirements and runtime code around `bundle/model`."""
    if not target.name.startswith("lambda-"):
        raise ValueError(f"{target.name} is not a Lambda target")
    copy_runtime_code(bundle, ("aws",))
    shutil.copytree(package_dir("edge"), bundle / "edge", ignore=IGNORE)
    aws = package_dir("functions") / "aws"
    for name in DOCKERFILES:
        shutil.copy2(aws / name, bundle / name)
    runtime = pinned(LAMBDA_DISTRIBUTIONS)
    write_lines(bundle / "requirements.txt", runtime)
    write_lines(bundle / "requirements-stream.txt", runtime + pinned(STREAM_DISTRIBUTIONS))

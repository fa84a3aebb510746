"""Lambda packaging: the bake output is a deployable SAM project and the images' build context.

`ortserve bake --target lambda-x86_64|lambda-arm64 --out DIR` leaves DIR with the model
in `model/` and, from here:

- `template.yaml`: the repository's template (the one source) with `DockerContext: .`
  and the bake target's architecture as the `Architecture` default;
- `samconfig.toml`: stack `ortserve`, ECR repositories and the S3 bucket resolved by
  SAM, `CAPABILITY_IAM`, and the architecture for `sam build` and `sam deploy`;
- `Dockerfile` (buffered handler) and `Dockerfile.stream` (edge daemon behind the Lambda
  Web Adapter), `requirements.txt` / `requirements-stream.txt` with every transitive
  dependency pinned and hashed (bake.lock), and the code they copy (`core/`,
  `functions/aws/*.py`, `edge/*.py`): nothing else, and `.dockerignore` keeps SAM's
  files out of the context.

So `cd DIR && sam build && sam deploy` deploys it, whatever DIR is.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from bake.errors import BakeError
from bake.lock import lock
from bake.packaging_common import IGNORE, RUNTIME_DISTRIBUTIONS, package_dir
from bake.targets import Target

DOCKERFILES = ("Dockerfile", "Dockerfile.stream")
# onnxruntime-genai's own runtime dependency, pinned too: the image must be the tested set.
LAMBDA_DISTRIBUTIONS = (*RUNTIME_DISTRIBUTIONS, "onnxruntime")
# The edge daemon's dependencies (the `edge` extra), for the streaming image.
STREAM_DISTRIBUTIONS = ("uvicorn", "h11", "click", "prometheus-client")
STACK_NAME = "ortserve"
# Where the repository's template builds from (the README's `--out dist/lambda`).
REPO_DOCKER_CONTEXT = "dist/lambda"
# What the Docker context must not send: SAM's own files (its build folder lands in DIR).
DOCKERIGNORE = (".aws-sam/", "template.yaml", "samconfig.toml", ".dockerignore")


def lambda_architecture(target: Target) -> str:
    """Lambda's name for the target's architecture (`x86_64` or `arm64`)."""
    return target.name.removeprefix("lambda-")


def repo_template() -> Path:
    """The repository's template.yaml, beside the `core` package (a source checkout).

    Raises:
        BakeError: ortserve is not installed from a source tree.
    """
    template = package_dir("core").parent / "template.yaml"
    if not template.is_file():
        raise BakeError(
            f"the Lambda bake writes its template from the repository's template.yaml, but "
            f"{template} does not exist: install ortserve from a checkout (pip install -e .)"
        )
    return template


def bake_template(text: str, architecture: str) -> str:
    """The repository template `text` as the bake writes it: built from its own folder,
    with `architecture` as the default.

    Raises:
        BakeError: The template no longer has the lines this rewrites.
    """
    context = f"DockerContext: {REPO_DOCKER_CONTEXT}"
    arch = re.compile(r"(\n  Architecture:\n    Type: String\n    Default: )(\w+)\n")
    if text.count(context) != 2 or len(arch.findall(text)) != 1:
        raise BakeError("template.yaml changed shape: update bake.package_lambda.bake_template")
    text = text.replace(context, "DockerContext: .")
    return arch.sub(lambda m: f"{m[1]}{architecture}\n", text)


def samconfig(architecture: str) -> str:
    """samconfig.toml for the bake output (SAM CLI's configuration file, version 0.1)."""
    overrides = f'"Architecture={architecture}"'
    return f"""# Written by `ortserve bake --target lambda-{architecture}`.
# `sam build && sam deploy` deploys this folder without questions. Give an API key
# source (or the explicit opt-out) on the command line, which replaces the
# parameter_overrides below (the template's Architecture default is the same), e.g.
#   sam deploy --parameter-overrides Architecture={architecture} \\
#     ApiKeysSecretArn=arn:aws:secretsmanager:REGION:ACCOUNT:secret:ortserve/api-keys-XXXXXX
# or add the keys to both parameter_overrides lines here.
version = 0.1

[default.global.parameters]
stack_name = "{STACK_NAME}"

[default.build.parameters]
parameter_overrides = {overrides}

[default.deploy.parameters]
capabilities = "CAPABILITY_IAM"
resolve_s3 = true
resolve_image_repos = true
confirm_changeset = false
fail_on_empty_changeset = false
parameter_overrides = {overrides}
"""


def _copy_py(source: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.glob("*.py")):
        shutil.copy2(path, dest / path.name)


def package_lambda(target: Target, bundle: Path, cache: Path | None = None) -> None:
    """Make `bundle` (holding `model/`) a SAM project and the images' build context.

    Args:
        target: A `lambda-*` target.
        bundle: The bake output folder.
        cache: Where requirement locks are kept (default: the bake's cache folder).

    Raises:
        BakeError: No template (not a source checkout), or pip cannot lock the requirements.
    """
    if not target.name.startswith("lambda-"):
        raise ValueError(f"{target.name} is not a Lambda target")
    if cache is None:
        from bake.settings import BakeSettings

        cache = BakeSettings().cache_dir
    architecture = lambda_architecture(target)
    # The code the Dockerfiles copy, and nothing else.
    shutil.copytree(package_dir("core"), bundle / "core", ignore=IGNORE)
    functions = package_dir("functions")
    (bundle / "functions").mkdir()
    shutil.copy2(functions / "__init__.py", bundle / "functions" / "__init__.py")
    _copy_py(functions / "aws", bundle / "functions" / "aws")
    _copy_py(package_dir("edge"), bundle / "edge")
    for name in DOCKERFILES:
        shutil.copy2(functions / "aws" / name, bundle / name)
    runtime = lock(LAMBDA_DISTRIBUTIONS, target.arch, cache)
    stream = lock((*LAMBDA_DISTRIBUTIONS, *STREAM_DISTRIBUTIONS), target.arch, cache)
    (bundle / "requirements.txt").write_text("\n".join(runtime) + "\n", encoding="utf-8")
    (bundle / "requirements-stream.txt").write_text("\n".join(stream) + "\n", encoding="utf-8")
    text = repo_template().read_text(encoding="utf-8")
    (bundle / "template.yaml").write_text(bake_template(text, architecture), encoding="utf-8")
    (bundle / "samconfig.toml").write_text(samconfig(architecture), encoding="utf-8")
    (bundle / ".dockerignore").write_text("\n".join(DOCKERIGNORE) + "\n", encoding="utf-8")

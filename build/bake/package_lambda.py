"""Lambda packaging: the bake output is a deployable SAM project and the images' build context.

`ortserve bake --target lambda-x86_64|lambda-arm64 --out DIR` leaves DIR with the model
in `model/` and, from here:

- `template.yaml`: the repository's template (the one source) with `DockerContext: .`
  and the bake target's architecture as the `Architecture` default;
- `samconfig.toml`: stack `ortserve`, ECR repositories and the S3 bucket resolved by
  SAM, `CAPABILITY_IAM`, and the architecture for `sam build` and `sam deploy`;
- `Dockerfile` (buffered handler) and `Dockerfile.stream` (edge daemon behind the Lambda
  Web Adapter), `requirements.txt` / `requirements-stream.txt` with every transitive
  dependency pinned and hashed (bake.lock), and the code they copy (`ortserve/core/`,
  `ortserve/functions/aws/*.py`, `ortserve/edge/*.py`): nothing else, and `.dockerignore`
  keeps SAM's files out of the context.

So `cd DIR && sam build && sam deploy` deploys it, whatever DIR is.
"""

from __future__ import annotations

import re
from pathlib import Path

from ortserve.bake.errors import BakeError
from ortserve.bake.lock import lock
from ortserve.bake.packaging_common import (
    MODEL_SUBDIR,
    RUNTIME_DISTRIBUTIONS,
    copy_runtime_code,
    package_dir,
)
from ortserve.bake.targets import Target
from ortserve.core.sizing import Memory, model_memory, shipped_caps, write_record

DOCKERFILES = ("Dockerfile", "Dockerfile.stream")
# onnxruntime-genai's own runtime dependency, pinned too: the image must be the tested set.
LAMBDA_DISTRIBUTIONS = (*RUNTIME_DISTRIBUTIONS, "onnxruntime")
# The edge daemon's dependencies (the `edge` extra), for the streaming image.
STREAM_DISTRIBUTIONS = ("uvicorn", "h11", "click", "prometheus-client")
STACK_NAME = "ortserve"
# Where the repository's template builds from (docs/lambda.md's `--out dist/lambda`).
REPO_DOCKER_CONTEXT = "dist/lambda"
# What the Docker context must not send: SAM's own files (its build folder lands in DIR).
DOCKERIGNORE = (".aws-sam/", "template.yaml", "samconfig.toml", "sizing.json", ".dockerignore")
# The template's MemorySize default (about 1.7 vCPUs) and Lambda's largest.
DEFAULT_MEMORY_MB = 3008
MAX_MEMORY_MB = 10240


def lambda_architecture(target: Target) -> str:
    """Lambda's name for the target's architecture (`x86_64` or `arm64`)."""
    return target.name.removeprefix("lambda-")


def repo_template() -> Path:
    """The repository's template.yaml, beside the `core` package (a source checkout).

    Raises:
        BakeError: ortserve is not installed from a source tree.
    """
    template = package_dir("ortserve.core").resolve().parent / "template.yaml"
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


def memory_size(model_dir: Path) -> tuple[int, Memory]:
    """The function's MemorySize for the model in `model_dir`: what one request at a
    time needs (`core.sizing`; an instance serves one invoke at a time), at least the
    template's default (Lambda's CPU share comes with the memory), and the terms.

    Raises:
        BakeError: It needs more than Lambda's 10,240 MB.
    """
    terms = model_memory(model_dir, sequences=1)
    if terms.total_mib > MAX_MEMORY_MB:
        raise BakeError(
            f"the model needs about {terms.total_mib} MB per instance, more than Lambda's "
            f"{MAX_MEMORY_MB} MB: bake a smaller model or precision"
        )
    return max(DEFAULT_MEMORY_MB, terms.total_mib), terms


def dockerfile_with_caps(text: str, terms: Memory) -> str:
    """A Dockerfile whose image keeps a request in the room MemorySize counts
    (`core.sizing.shipped_caps`): an ENV line before its CMD or ENTRYPOINT."""
    caps = shipped_caps(terms)
    if not caps:
        return text
    start = re.search(r"^(CMD|ENTRYPOINT) ", text, re.MULTILINE)
    if start is None:
        raise BakeError("a Lambda Dockerfile has no CMD or ENTRYPOINT: update the bake")
    values = " \\\n    ".join(f"{name}={value}" for name, value in caps.items())
    block = (
        "# Written by the bake (sizing.json): MemorySize counts one sequence of "
        f"{terms.tokens_per_sequence} tokens;\n# these keep a request in that room. DL3064 "
        "takes ORTSERVE_MAX_*_TOKENS for secrets:\n# they are counts of tokens.\n"
        f"# hadolint ignore=DL3064\nENV {values}\n\n"
    )
    return text[: start.start()] + block + text[start.start() :]


def samconfig(architecture: str, memory_mb: int = DEFAULT_MEMORY_MB) -> str:
    """samconfig.toml for the bake output (SAM CLI's configuration file, version 0.1)."""
    overrides = f'"Architecture={architecture} MemorySize={memory_mb}"'
    return f"""# Written by `ortserve bake --target lambda-{architecture}`.
# `sam build && sam deploy` deploys this folder without questions. Give an API key
# source (or the explicit opt-out) on the command line, which replaces the
# parameter_overrides below (the template's Architecture default is the same), e.g.
#   sam deploy --parameter-overrides Architecture={architecture} MemorySize={memory_mb} \\
#     ApiKeysSecretArn=arn:aws:secretsmanager:REGION:ACCOUNT:secret:ortserve/api-keys-XXXXXX
# or add the keys to both parameter_overrides lines here. MemorySize is what the model
# needs (sizing.json: its terms), at least the template's default.
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
        from ortserve.bake.settings import BakeSettings

        cache = BakeSettings().cache_dir
    architecture = lambda_architecture(target)
    # The code the Dockerfiles copy, and nothing else.
    copy_runtime_code(bundle, ("aws",), edge=True)
    memory_mb, terms = memory_size(bundle / MODEL_SUBDIR)
    for name in DOCKERFILES:
        text = (package_dir("ortserve.functions") / "aws" / name).read_text(encoding="utf-8")
        (bundle / name).write_text(dockerfile_with_caps(text, terms), encoding="utf-8")
    runtime = lock(LAMBDA_DISTRIBUTIONS, target.arch, cache)
    stream = lock((*LAMBDA_DISTRIBUTIONS, *STREAM_DISTRIBUTIONS), target.arch, cache)
    (bundle / "requirements.txt").write_text("\n".join(runtime) + "\n", encoding="utf-8")
    (bundle / "requirements-stream.txt").write_text("\n".join(stream) + "\n", encoding="utf-8")
    text = repo_template().read_text(encoding="utf-8")
    (bundle / "template.yaml").write_text(bake_template(text, architecture), encoding="utf-8")
    (bundle / "samconfig.toml").write_text(samconfig(architecture, memory_mb), encoding="utf-8")
    write_record(bundle / "sizing.json", terms, memory_size_mb=memory_mb)
    (bundle / ".dockerignore").write_text("\n".join(DOCKERIGNORE) + "\n", encoding="utf-8")

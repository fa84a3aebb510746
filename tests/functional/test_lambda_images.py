"""The Lambda images, checked without a Docker engine: the Dockerfiles against the bake output
they are built from, hadolint, and the streaming image's entry point run for real.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.support.dockerfile import (
    TASK_ROOT,
    env_of,
    final_stage,
    image_env,
    parse,
    run_compile_steps,
)
from benchmarks.support.servers import free_port, serve_process
from ortserve.core.api import Api
from ortserve.core.settings import ServerSettings
from ortserve.core.state import ModelState
from tests.functional.bakehelp import hash_checked_install, locked_pins
from tests.functional.harness import API_KEY, SERVER_ENV, Http, InProcess, normalized
from tests.functional.lambda_target import make_lambda_bundle
from tests.tools import tool

ROOT = Path(__file__).resolve().parents[2]
AWS = ROOT / "functions" / "aws"
ARCH_WORDS = re.compile(r"x86_64|amd64|aarch64|arm64", re.IGNORECASE)


@pytest.fixture(scope="module")
def bundle(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_lambda_bundle(tiny_model_dir, tmp_path_factory.mktemp("lambda"))


# -- the bake output is the Docker context ------------------------------------------------


def test_the_bundle_holds_what_the_images_need(bundle: Path) -> None:
    for name in ("Dockerfile", "Dockerfile.stream"):
        assert (bundle / name).read_bytes() == (AWS / name).read_bytes()
    assert (bundle / "model" / "manifest.json").is_file()
    package = bundle / "ortserve"  # the one import name, laid out as the wheel does
    assert (package / "functions" / "aws" / "handler.py").is_file()
    assert (package / "edge" / "daemon.py").is_file()
    assert (package / "core" / "routes.py").is_file()
    # The front (the command, the store, the Python API) and the bake stay out.
    assert not (package / "cli.py").exists() and not (package / "store.py").exists()
    assert not (package / "bake").exists() and not (package / "functions" / "gcp").exists()
    pins = locked_pins(bundle / "requirements.txt")
    assert pins["onnxruntime-genai"].startswith("0.18")
    # Every transitive dependency is pinned, these among them (they floated before).
    assert {"protobuf", "packaging", "flatbuffers", "markupsafe", "typing-extensions"} <= set(pins)
    stream = locked_pins(bundle / "requirements-stream.txt")
    assert pins.items() < stream.items() and "uvicorn" in stream
    assert not any(p.startswith(("boto3", "awslambdaric")) for p in pins)  # the base has them


def test_the_bundle_holds_only_what_the_images_copy(bundle: Path) -> None:
    """The Docker context is the Dockerfiles' COPY sources, and SAM's files are ignored."""
    copied: set[Path] = set()
    for name in ("Dockerfile", "Dockerfile.stream"):
        for ins in parse(AWS / name):
            words = [w for w in ins.words() if not w.startswith("--")]
            if ins.keyword == "COPY" and not any(w.startswith("--from=") for w in ins.words()):
                for source in words[:-1]:
                    for match in bundle.glob(source.rstrip("/")):
                        found = match.rglob("*") if match.is_dir() else [match]
                        copied |= {f for f in found if f.is_file()}
    sam = {
        "template.yaml",
        "samconfig.toml",
        "sizing.json",
        ".dockerignore",
        "Dockerfile",
        "Dockerfile.stream",
    }
    every = {f.relative_to(bundle).as_posix() for f in bundle.rglob("*") if f.is_file()}
    assert every - {f.relative_to(bundle).as_posix() for f in copied} - sam == set()
    ignored = (bundle / ".dockerignore").read_text().split()
    assert {".aws-sam/", "template.yaml", "samconfig.toml", "sizing.json"} <= set(ignored)


@pytest.mark.parametrize("target", ["lambda-x86_64", "lambda-arm64"])
def test_the_bake_writes_a_deployable_sam_project(
    tiny_model_dir: Path, tmp_path: Path, target: str
) -> None:
    """`cd DIR && sam build && sam deploy`, whatever DIR is: the template builds from its
    own folder, for the bake target's architecture, with a stack name in samconfig.toml."""
    import tomllib

    bundle = make_lambda_bundle(tiny_model_dir, tmp_path / "anywhere", target)
    arch = target.removeprefix("lambda-")
    template = (bundle / "template.yaml").read_text()
    assert (
        template.count("DockerContext: .\n") == 2
        and "dist/lambda" not in template.split("\nParameters:")[1]
    )
    assert f"  Architecture:\n    Type: String\n    Default: {arch}\n" in template
    config = tomllib.loads((bundle / "samconfig.toml").read_text())
    assert config["default"]["global"]["parameters"]["stack_name"] == "ortserve"
    # MemorySize from the memory formula (sizing.json), at least the template's default.
    size = json.loads((bundle / "sizing.json").read_text())
    assert size["memory_size_mb"] == max(3008, size["terms"]["total_mib"])
    assert config["default"]["deploy"]["parameters"]["parameter_overrides"] == (
        f"Architecture={arch} MemorySize={size['memory_size_mb']}"
    )
    sam = shutil.which("sam", path=str(Path(sys.executable).parent)) or shutil.which("sam")
    if sam is not None:  # the SAM CLI is not a test dependency; run it where it is there
        proc = subprocess.run(
            [sam, "validate", "--lint", "--region", "us-east-1"],
            cwd=bundle,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env={**os.environ, "SAM_CLI_TELEMETRY": "0"},
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
@pytest.mark.parametrize("name", ["requirements.txt", "requirements-stream.txt"])
def test_the_pins_install_in_hash_checking_mode_with_nothing_left_to_resolve(
    tiny_model_dir: Path, tmp_path: Path, arch: str, name: str
) -> None:
    """pip as in the image: every dependency is pinned and hashed (hash-checking mode
    refuses anything else), and it installs exactly the pinned set."""
    target = "lambda-arm64" if arch == "aarch64" else "lambda-x86_64"
    requirements = make_lambda_bundle(tiny_model_dir, tmp_path / "bundle", target) / name
    installed = hash_checked_install(requirements, arch, 34, tmp_path)
    assert installed == locked_pins(requirements)


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.stream"])
def test_every_copy_source_exists_in_the_bundle(bundle: Path, name: str) -> None:
    instructions = parse(AWS / name)
    copies = [ins for ins in instructions if ins.keyword in {"COPY", "ADD"}]
    assert copies
    for ins in copies:
        words = ins.words()
        if any(w.startswith("--from=") for w in words):
            continue  # from another build stage, not the context
        *sources, dest = [w for w in words if not w.startswith("--")]
        assert ins.keyword == "COPY", "ADD could fetch URLs or unpack archives: use COPY"
        assert dest.startswith(TASK_ROOT), dest
        for source in sources:
            assert list(bundle.glob(source.rstrip("/"))), f"{name}: COPY {source} matches nothing"


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.stream"])
def test_the_base_image_is_a_python_312_lambda_image_for_any_arch(name: str) -> None:
    instructions = parse(AWS / name)
    base = final_stage(instructions)[0].words()
    assert not any(w.startswith("--platform") for w in base)  # sam build picks the platform
    match = re.fullmatch(r"public\.ecr\.aws/lambda/python:(\d+)\.(\d+)", base[-1])
    assert match, base
    assert (int(match[1]), int(match[2])) >= (3, 12)  # glibc 2.28+ for onnxruntime-genai
    for ins in instructions:
        if ins.keyword in {"FROM", "RUN", "COPY"}:
            assert not ARCH_WORDS.search(ins.args), f"{name}: arch-specific: {ins.args}"
        if ins.keyword == "RUN":
            assert not re.search(r"\b(curl|wget)\b", ins.args), "downloads belong in the bake"


@pytest.mark.parametrize(
    ("name", "entry"),
    [
        ("Dockerfile", "ortserve.functions.aws.handler"),
        ("Dockerfile.stream", "ortserve.edge.daemon"),
    ],
)
def test_the_image_compiles_its_code_so_a_cold_start_compiles_nothing(
    tiny_model_dir: Path, tmp_path: Path, name: str, entry: str
) -> None:
    bundle = make_lambda_bundle(tiny_model_dir, tmp_path / "task")
    assert run_compile_steps(AWS / name, bundle) == 1
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORTSERVE_", "AWS_"))}
    env.update(image_env(AWS / name, bundle), PYTHONPATH=str(bundle), PYTHONDONTWRITEBYTECODE="1")
    env["ORTSERVE_LAMBDA_LOAD_AT_INIT"] = "never"  # imports only
    proc = subprocess.run(
        [sys.executable, "-v", "-c", f"import {entry}"],
        cwd=bundle,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    ours = [line for line in proc.stderr.splitlines() if str(bundle) in line]
    from_source = [
        line
        for line in ours
        if line.startswith("# code object from") and line.rstrip("'").endswith(".py")
    ]
    assert any(".pyc" in line for line in ours) and not from_source, from_source
    assert env["PYDANTIC_DISABLE_PLUGINS"] == "1"  # no entry-point scan on the cold path


def test_the_buffered_image_runs_the_handler(bundle: Path) -> None:
    final = final_stage(parse(AWS / "Dockerfile"))
    (cmd,) = [ins.words() for ins in final if ins.keyword == "CMD"]
    assert cmd == ["ortserve.functions.aws.handler.handler"]
    assert not [ins for ins in final if ins.keyword == "ENTRYPOINT"]  # the base's runs the RIC
    module, _, function = cmd[0].rpartition(".")
    source = (bundle / Path(*module.split("."))).with_suffix(".py").read_text()
    assert re.search(rf"^def {function}\(event", source, re.MULTILINE)
    env = env_of(final)
    assert env["ORTSERVE_MODEL_DIR"] == f"{TASK_ROOT}/model"
    assert env["ORTSERVE_PROVIDERS"] == "cpu"
    assert "ORTSERVE_MODEL_S3_URI" not in env  # the model is baked in by default


def test_the_streaming_image_wires_the_web_adapter() -> None:
    instructions = parse(AWS / "Dockerfile.stream")
    adapter = instructions[instructions.index(next(i for i in instructions if i.keyword == "FROM"))]
    assert adapter.words()[0].startswith("public.ecr.aws/awsguru/aws-lambda-adapter:${LWA_VERSION}")
    (version,) = [ins.args for ins in instructions if ins.keyword == "ARG"]
    assert re.fullmatch(r"LWA_VERSION=\d+\.\d+\.\d+", version)  # pinned, never `latest`
    final = final_stage(instructions)
    copies = [ins.words() for ins in final if ins.keyword == "COPY"]
    assert ["--from=web-adapter", "/lambda-adapter", "/opt/extensions/lambda-adapter"] in copies
    env = env_of(final)
    assert env["AWS_LWA_INVOKE_MODE"] == "response_stream"
    assert env["AWS_LWA_READINESS_CHECK_PATH"] == "/readyz"
    assert env["AWS_LWA_PORT"] == env["ORTSERVE_PORT"]
    assert env["AWS_LWA_ASYNC_INIT"] == "true"  # a load past the 10 s init is not redone
    (entry,) = [ins.words() for ins in final if ins.keyword == "ENTRYPOINT"]
    assert entry == ["python3", "-m", "ortserve.functions.aws.serve"]


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.stream"])
def test_hadolint(name: str) -> None:
    hadolint = tool("hadolint")
    proc = subprocess.run(
        [hadolint, "--no-color", str(AWS / name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- the streaming image's entry point, run as its ENTRYPOINT says ------------------------


@pytest.fixture(scope="module")
def stream_server(bundle: Path) -> Iterator[str]:
    final = final_stage(parse(AWS / "Dockerfile.stream"))
    (entry,) = [ins.words() for ins in final if ins.keyword == "ENTRYPOINT"]
    image_env = {k: v.replace(TASK_ROOT, str(bundle)) for k, v in env_of(final).items()}
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORTSERVE_", "AWS_"))}
    env.update(
        image_env,
        **SERVER_ENV,
        PYTHONPATH=str(bundle),
        ORTSERVE_HOST="127.0.0.1",
        ORTSERVE_PORT=str(port),
    )
    command = [sys.executable if entry[0] == "python3" else entry[0], *entry[1:]]
    with serve_process(command, env, port, cwd=bundle) as server:
        yield server.base
    assert server.proc.returncode == 0  # drained and stopped on SIGTERM, as Lambda sends it


def test_the_streaming_image_streams_the_same_sse_bytes(
    stream_server: str, tiny_model_dir: Path
) -> None:
    settings = ServerSettings(
        model_dir=tiny_model_dir, providers="cpu", api_keys=[API_KEY], max_new_tokens=2000
    )
    state = ModelState(settings)
    state.load()
    reference = InProcess(Api(state, settings))
    target = Http("lambda-stream", stream_server)
    requests = [
        ("/generate", {"prompt": "Parity", "max_new_tokens": 24, "temperature": 0, "stream": True}),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "P"}],
                "max_tokens": 10,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ),
    ]
    for path, body in requests:
        got, want = target.call("POST", path, body), reference.call("POST", path, body)
        assert got.status == want.status == 200
        assert normalized(got.body) == normalized(want.body), path
    # And it streams: the first event arrives while the model is still generating. The
    # tiny model is fast (2,000 tokens in a fraction of a second, during which og holds
    # the GIL the health answer needs): eight choices of 2,000 forced tokens each (two
    # batches of four, one after the other) keep it generating longer; health is asked
    # on a connection opened beforehand, with the key (without one it says the status
    # only), so that asking takes one loopback round trip.
    body = {
        "prompt": "Hello",
        "max_tokens": 2000,
        "n": 8,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    auth = {"authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=stream_server, timeout=60, headers=auth) as health:
        assert health.get("/healthz").json()["active"] == 0
        with target.open_stream("/v1/completions", body) as chunks:
            assert next(chunks).startswith(b"data: {")
            assert health.get("/healthz").json()["active"] >= 1  # still generating
            assert b"data: [DONE]" in b"".join(chunks)


def test_the_streaming_entry_point_stops_with_the_reason(bundle: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORTSERVE_", "AWS_"))}
    env.update(
        PYTHONPATH=str(bundle),
        ORTSERVE_API_KEYS=API_KEY,
        ORTSERVE_MODEL_S3_URI="s3://ortserve-nowhere/model",
        ORTSERVE_MODEL_CACHE_DIR=str(bundle / "tmp"),
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )  # no credentials anywhere: fails at once
    proc = subprocess.run(
        [sys.executable, "-m", "ortserve.functions.aws.serve"],
        cwd=bundle,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    (line,) = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert line["message"] == "cold start failed"
    assert line["reason"].startswith("cannot download s3://ortserve-nowhere/model/manifest.json")


def test_the_streaming_entry_point_refuses_to_serve_without_api_keys(bundle: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORTSERVE_", "AWS_"))}
    env.update(PYTHONPATH=str(bundle))
    proc = subprocess.run(
        [sys.executable, "-m", "ortserve.functions.aws.serve"],
        cwd=bundle,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    (line,) = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert line["message"] == "cold start failed"
    assert line["reason"].startswith("no API key is configured")
    assert "AllowUnauthenticated=true" in line["reason"]

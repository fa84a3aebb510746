"""The Cloud Run service target, checked without a Docker engine or a cluster: the bake
output as the image's build context, hadolint, the Cloud Run / Kubernetes / KEDA manifests
against their schemas, the sizing rule, and the image's command run for real with $PORT.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import distribution
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from benchmarks.support.dockerfile import env_of, final_stage, parse
from benchmarks.support.servers import free_port, serve_process
from ortserve.bake.errors import BakeError
from ortserve.bake.package import GCF_DISTRIBUTIONS, GCF_GLIBC_MINOR, GCF_PYTHON, package
from ortserve.bake.package_cloudrun import package_cloudrun, sizing, sizing_for
from ortserve.bake.packaging_common import pinned_closure
from ortserve.bake.targets import get_target
from tests.functional.bakehelp import hash_checked_install, locked_pins
from tests.functional.harness import AUTH, SERVER_ENV
from tests.tools import tool

APP = "/app"  # the image's code and model folder (the Dockerfile's WORKDIR)
SMOLLM2_135M = {
    "context_length": 8192,
    "vocab_size": 49152,
    "decoder": {"num_hidden_layers": 30, "num_key_value_heads": 3, "head_size": 64},
}
QWEN25_05B = {
    "context_length": 32768,
    "vocab_size": 151936,
    "decoder": {"num_hidden_layers": 24, "num_key_value_heads": 2, "head_size": 64},
}


@pytest.fixture(scope="module")
def bundle(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`ortserve bake --target cloudrun`'s packaging around a copy of the tiny model."""
    dest = tmp_path_factory.mktemp("cloudrun")
    shutil.copytree(tiny_model_dir, dest / "model")
    package_cloudrun(get_target("cloudrun"), dest)
    return dest


def _yaml(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data


def _final(bundle: Path) -> list[Any]:
    return final_stage(parse(bundle / "Dockerfile"))


# -- the bake output is the image's build context ------------------------------------------


def test_every_copy_source_exists_and_nothing_is_left_to_fill(bundle: Path) -> None:
    text = (bundle / "Dockerfile").read_text()
    assert "{{" not in text
    for name in (
        "service.yaml",
        "k8s/deployment.yaml",
        "k8s/service.yaml",
        "k8s/scaledobject.yaml",
    ):
        assert "{{" not in (bundle / name).read_text(), name
    assert "ADD" not in {ins.keyword for ins in _final(bundle)}  # could fetch or unpack: COPY
    copies = [ins.words() for ins in _final(bundle) if ins.keyword == "COPY"]
    assert copies
    for words in copies:
        *sources, dest = [w for w in words if not w.startswith("--")]
        assert dest.startswith(APP), dest
        for source in sources:
            assert list(bundle.glob(source.rstrip("/"))), f"COPY {source} matches nothing"


def test_the_requirements_pin_the_whole_closure(bundle: Path) -> None:
    pins = dict(line.split("==") for line in (bundle / "requirements.txt").read_text().split())
    assert all(re.fullmatch(r"[0-9][^=\s]*", v) for v in pins.values()), pins
    # What floated in the Lambda images before (issue 17, item 7), and the daemon's own.
    floated = (
        "onnxruntime-genai",
        "onnxruntime",
        "protobuf",
        "packaging",
        "flatbuffers",
        "markupsafe",
        "typing-extensions",
        "uvicorn",
        "h11",
        "prometheus-client",
    )
    for name in floated:
        assert name in pins, name
    for name, ver in pins.items():
        assert distribution(name).version == ver  # the versions tested here
    # --no-deps: the image installs exactly this set, and pip check proves it complete.
    (run,) = [
        ins.args for ins in _final(bundle) if ins.keyword == "RUN" and "pip install" in ins.args
    ]
    assert "--no-deps" in run and "pip check" in run and "--only-binary=:all:" in run


def test_the_image_is_slim_python_312_non_root_cpu_only(bundle: Path) -> None:
    instructions = parse(bundle / "Dockerfile")
    assert [i.keyword for i in instructions].count("FROM") == 1
    base = final_stage(instructions)[0].words()[-1]
    match = re.fullmatch(r"python:3\.(\d+)-slim(-\w+)?", base)
    assert match and int(match[1]) == 12, base  # pinned by tag; never `latest`
    assert GCF_PYTHON == "3.12"
    (user,) = [ins.words() for ins in _final(bundle) if ins.keyword == "USER"]
    uid = user[0].split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can check it
    env = env_of(_final(bundle))
    assert env["ORTSERVE_PROVIDERS"] == "cpu"
    assert env["ORTSERVE_HOST"] == "0.0.0.0"
    assert env["ORTSERVE_MODEL_DIR"] == f"{APP}/model"
    assert float(env["ORTSERVE_DRAIN_TIMEOUT_S"]) < 10  # Cloud Run kills 10 s after SIGTERM
    size = json.loads((bundle / "sizing.json").read_text())
    assert env["ORTSERVE_THREADS"] == str(size["cpu"])
    # The tiny model's context (2,048) is the sized room: no cap, requests get what fits.
    assert (env["ORTSERVE_MAX_NEW_TOKENS"], env["ORTSERVE_MAX_PROMPT_TOKENS"]) == ("0", "0")
    assert size["max_new_tokens"] == 0
    (cmd,) = [ins.words() for ins in _final(bundle) if ins.keyword == "CMD"]
    assert cmd == ["python3", "serve.py"]


def test_hadolint(bundle: Path) -> None:
    hadolint = tool("hadolint")
    proc = subprocess.run(
        [hadolint, "--no-color", str(bundle / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- the manifests, against their schemas ---------------------------------------------------


def test_the_kubernetes_manifests_pass_the_schemas_strictly(bundle: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for name in ("k8s/deployment.yaml", "k8s/service.yaml"):
        # strict: an unknown (e.g. misspelt) field is an error, not ignored.
        kubernetes_validate.validate(_yaml(bundle / name), "1.33", strict=True)
        kubernetes_validate.validate(
            _yaml(bundle / name), kubernetes_validate.latest_version(), strict=True
        )


def _strictly(model: Any, data: dict[str, Any]) -> None:
    """`data` validates as `model` and every field it sets is one of the schema's (a field
    the CRD does not know would be dropped and the round trip would differ)."""
    parsed = model.model_validate(data)
    assert parsed.model_dump(by_alias=True, exclude_unset=True, mode="json") == data


def test_the_cloud_run_service_is_a_valid_knative_service(bundle: Path) -> None:
    serving = pytest.importorskip("cloudcoil.models.knative_serving.serving.v1")
    data = _yaml(bundle / "service.yaml")
    # The models' IntOrString quantity fails on a whole-number string such as "2" (pydantic
    # coerces it to int, then applies the string pattern): check the same quantity in
    # millicpu there.
    millicpu = copy.deepcopy(data)
    for container in millicpu["spec"]["template"]["spec"]["containers"]:
        limits = container["resources"]["limits"]
        assert re.fullmatch(r"\d+", limits["cpu"])  # whole CPUs: Cloud Run's form above 1
        limits["cpu"] = f"{int(limits['cpu']) * 1000}m"
    _strictly(serving.Service, millicpu)
    size = json.loads((bundle / "sizing.json").read_text())
    spec = data["spec"]["template"]["spec"]
    assert spec["containerConcurrency"] == size["concurrency"]
    (container,) = spec["containers"]
    assert container["resources"]["limits"] == {"cpu": str(size["cpu"]), "memory": size["memory"]}
    assert container["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    probe = container["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] <= 240  # Cloud Run's limit
    assert container["ports"] == [{"name": "http1", "containerPort": 8080}]
    (keys,) = [e for e in container["env"] if e["name"] == "ORTSERVE_API_KEYS"]
    assert "value" not in keys and keys["valueFrom"]["secretKeyRef"]["name"]  # Secret Manager


def test_the_deployment_probes_and_resources_follow_the_model(bundle: Path) -> None:
    data = _yaml(bundle / "k8s/deployment.yaml")
    size = json.loads((bundle / "sizing.json").read_text())
    pod = data["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    want = {"cpu": str(size["cpu"]), "memory": size["memory"]}
    assert container["resources"] == {"requests": want, "limits": want}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    service = _yaml(bundle / "k8s/service.yaml")
    assert service["spec"]["selector"] == data["spec"]["selector"]["matchLabels"]


def test_the_pods_get_no_service_account_token(bundle: Path) -> None:
    """The daemon never calls the Kubernetes API (checkov CKV_K8S_38)."""
    pod = _yaml(bundle / "k8s/deployment.yaml")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False


def test_keda_scales_the_deployment_on_its_pods_metrics(bundle: Path) -> None:
    keda = pytest.importorskip("cloudcoil.models.keda.v1alpha1")
    data = _yaml(bundle / "k8s/scaledobject.yaml")
    _strictly(keda.ScaledObject, data)
    deployment = _yaml(bundle / "k8s/deployment.yaml")
    assert data["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (trigger,) = data["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for key, value in re.findall(r'(\w+)="([^"]*)"', trigger["metadata"]["query"]):
        assert labels.get(key) == value  # the query selects the Deployment's pods
    size = json.loads((bundle / "sizing.json").read_text())
    # A replica's share is what it decodes as one batch (Cloud Run's concurrency too).
    assert float(trigger["metadata"]["threshold"]) == size["concurrency"]


_SUM = re.compile(r"sum\((?P<metric>ortserve_\w+)\{[^}]*\}\)")


def _keda_replicas(scaled_object: dict[str, Any], pods: list[dict[str, int]]) -> int:
    """The replicas KEDA's HPA asks for when the Deployment's pods report `pods` (each:
    metric name -> value): the query, a sum of `sum(metric{selector})` terms, evaluated over
    them, and the HPA's rule for KEDA's AverageValue target, ceil(value / threshold) between
    minReplicaCount and maxReplicaCount."""
    spec = scaled_object["spec"]
    (trigger,) = spec["triggers"]
    terms = [_SUM.fullmatch(t.strip()) for t in trigger["metadata"]["query"].split(" + ")]
    assert all(terms), trigger["metadata"]["query"]  # only what this evaluates
    value = sum(pod.get(m["metric"], 0) for m in terms if m for pod in pods)
    wanted = math.ceil(value / float(trigger["metadata"]["threshold"]))
    return min(int(spec["maxReplicaCount"]), max(int(spec["minReplicaCount"]), wanted))


def test_keda_counts_a_busy_replica_as_busy(bundle: Path) -> None:
    """Replicas follow the requests generating plus those waiting (#26 item 6): on the queue
    alone, two replicas each decoding a full batch with nothing queued were scaled in to one."""
    data = _yaml(bundle / "k8s/scaledobject.yaml")
    batch = json.loads((bundle / "sizing.json").read_text())["concurrency"]

    def pod(active: int, waiting: int) -> dict[str, int]:
        return {"ortserve_active_generations": active, "ortserve_queue_depth": waiting}

    assert _keda_replicas(data, [pod(batch, 0), pod(batch, 0)]) == 2
    assert _keda_replicas(data, [pod(batch, 0), pod(1, 0)]) == 2
    assert _keda_replicas(data, [pod(batch, batch)]) == 2  # a batch waiting: one more
    assert _keda_replicas(data, [pod(0, 0), pod(0, 0)]) == 1
    assert _keda_replicas(data, [pod(batch, 100)]) == data["spec"]["maxReplicaCount"]


def test_an_empty_query_is_an_error_not_zero(bundle: Path) -> None:
    """KEDA's Prometheus scaler reads an empty result as 0 unless told (ignoreNullValues,
    default true): a query that selects no pod would then scale in to one and never out."""
    (trigger,) = _yaml(bundle / "k8s/scaledobject.yaml")["spec"]["triggers"]
    assert trigger["metadata"]["ignoreNullValues"] == "false"


def test_keda_scales_in_slowly_and_sets_nothing_without_effect(bundle: Path) -> None:
    spec = _yaml(bundle / "k8s/scaledobject.yaml")["spec"]
    # cooldownPeriod and activationThreshold act only at zero replicas (KEDA's scaling to
    # and from zero); with a minimum of one they would only mislead.
    assert spec["minReplicaCount"] == 1
    assert "cooldownPeriod" not in spec
    assert "activationThreshold" not in spec["triggers"][0]["metadata"]
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    down = behavior["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 300  # a lull shorter than this drops nothing
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0


# -- the sizing rule -----------------------------------------------------------------------


def test_sizing_of_real_model_shapes() -> None:
    small = sizing_for(150 << 20, SMOLLM2_135M)
    # core.sizing at parts of 64 tokens: 256 MiB + the engine process's 64 MiB + 1.25 x
    # 150 MiB + 4 x 4096 tokens x 45 KiB (fp32 KV) + 4 parts of 64 x 49,152 x 4 B x 1.5 +
    # a cache slot (180 MiB + 64 positions of logits) + 16 MiB of stored responses =
    # 1508 MiB -> 1536 MiB
    assert small.memory.total_mib == 256 + 64 + 188 + 720 + 72 + 192 + 16
    assert (small.concurrency, small.cpu, small.memory_mib, small.kv_mib) == (4, 2, 1536, 720)
    # The KV cache is sized for 4096 tokens: prompt and new tokens are capped to fit.
    assert (small.max_prompt_tokens, small.max_new_tokens) == (4096 - 512, 512)
    qwen = sizing_for(500 << 20, QWEN25_05B)
    assert (qwen.cpu, qwen.memory_mib) == (2, 1792)
    big = sizing_for(6 << 30, QWEN25_05B)  # over 8 GiB: Cloud Run wants 4 CPUs
    assert big.memory_mib > 8192 and big.cpu == 4
    with pytest.raises(BakeError, match="more than Cloud Run's"):
        sizing_for(30 << 30, QWEN25_05B)


def test_sizing_reads_the_baked_model(bundle: Path) -> None:
    size = sizing(bundle / "model")
    assert size.memory_mib == 1024 and size.max_prompt_tokens == 0  # tiny: the floor


# -- Cloud Functions bundle: the Python version and the requirements ------------------------


@pytest.fixture(scope="module")
def gcf_bundle(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`ortserve bake --target gcf`'s packaging around a copy of the tiny model."""
    dest = tmp_path_factory.mktemp("gcf")
    shutil.copytree(tiny_model_dir, dest / "model")
    package(get_target("gcf"), dest)
    return dest


def test_the_gcf_bundle_names_its_python(gcf_bundle: Path) -> None:
    assert (gcf_bundle / ".python-version").read_text() == "3.12\n"
    assert (gcf_bundle / "main.py").is_file()


def test_the_gcf_requirements_pin_and_hash_the_whole_closure(gcf_bundle: Path) -> None:
    """The buildpack's pip installs requirements.txt: every line hashed puts it in
    hash-checking mode, so each distribution it installs must be pinned there (#26 item 5:
    9 pins, 42 installed, the server's own floating)."""
    pins = locked_pins(gcf_bundle / "requirements.txt")
    floated = (
        "onnxruntime",
        "gunicorn",
        "flask",
        "werkzeug",
        "protobuf",
        "huggingface-hub",
        "click",
        "watchdog",
        "cloudevents",
    )
    for name in (*floated, "onnxruntime-genai", "functions-framework", "pydantic"):
        assert name in pins, name
    for name, ver in pins.items():
        assert distribution(name).version == ver  # the versions tested here
    # The same closure as the installed distributions' own metadata names, transitively.
    assert sorted(f"{n}=={v}" for n, v in pins.items()) == sorted(pinned_closure(GCF_DISTRIBUTIONS))


@pytest.mark.slow
def test_the_gcf_pins_install_in_hash_checking_mode_with_nothing_left_to_resolve(
    gcf_bundle: Path, tmp_path: Path
) -> None:
    """pip as the python312 runtime's buildpack runs it (Ubuntu 22.04: glibc 2.35) installs
    exactly the pinned set, every file checked against its hash."""
    requirements = gcf_bundle / "requirements.txt"
    installed = hash_checked_install(requirements, "x86_64", GCF_GLIBC_MINOR, tmp_path)
    assert installed == locked_pins(requirements)


# -- the image's command, run as its CMD says, with Cloud Run's PORT ---------------------


@contextmanager
def _image_command(
    bundle: Path, task: Path, more_env: dict[str, str] | None = None
) -> Iterator[str]:
    """The image's command (its CMD, its ENV, Cloud Run's PORT) run outside Docker in
    `task`, laid out as the image copies the bundle; `more_env` added (APP: `task`)."""
    for name in ("model", "ortserve", "serve.py"):  # what the image copies
        src = bundle / name
        if src.is_dir():
            shutil.copytree(src, task / name)
        else:
            shutil.copy2(src, task / name)
    final = _final(bundle)
    (compile_step,) = [i.words() for i in final if i.keyword == "RUN" and "compileall" in i.args]
    subprocess.run(
        [sys.executable if w == "python3" else w.replace(APP, str(task)) for w in compile_step],
        check=True,
        timeout=300,
    )
    (cmd,) = [ins.words() for ins in final if ins.keyword == "CMD"]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORTSERVE_", "PORT"))}
    env.update({k: v.replace(APP, str(task)) for k, v in env_of(final).items()})
    env.update({k: v.replace(APP, str(task)) for k, v in (more_env or {}).items()})
    env.update(
        ORTSERVE_API_KEYS=SERVER_ENV["ORTSERVE_API_KEYS"],
        PORT=str(port),
        PYTHONPATH=str(task),
        PYTHONDONTWRITEBYTECODE="1",
    )
    assert env["ORTSERVE_PORT"] != str(port)  # PORT wins over the image's ORTSERVE_PORT
    command = [sys.executable if cmd[0] == "python3" else cmd[0], *cmd[1:]]
    with serve_process(command, env, port, cwd=task) as server:
        yield server.base
    assert server.proc.returncode == 0  # drained and stopped on SIGTERM, as Cloud Run sends it


@pytest.fixture(scope="module")
def service(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with _image_command(bundle, tmp_path_factory.mktemp("app")) as base:
        yield base


def test_the_image_serves_an_embedding_model_and_more_models(bundle: Path, tmp_path: Path) -> None:
    """ORTSERVE_MODELS in the image (a folder added to it): the chat model and the
    embedding model behind one service; an embedding model's own image serves it alone."""
    from tests.models import all_minilm

    task = tmp_path / "app"
    task.mkdir()
    shutil.copytree(all_minilm(), task / "minilm")
    with _image_command(bundle, task, {"ORTSERVE_MODELS": f"{APP}/minilm"}) as base:
        listed = httpx.get(f"{base}/v1/models", headers=AUTH, timeout=30).json()["data"]
        assert [m["id"] for m in listed][1:] == ["all-minilm:l6-v2"]
        embedded = httpx.post(
            f"{base}/v1/embeddings", json={"input": "a cat"}, headers=AUTH, timeout=60
        )
        assert len(embedded.json()["data"][0]["embedding"]) == 384
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        reply = httpx.post(f"{base}/v1/chat/completions", json=chat, headers=AUTH, timeout=60)
        assert reply.status_code == 200
    alone = tmp_path / "embedding-bundle"
    shutil.copytree(all_minilm(), alone / "model")
    package_cloudrun(get_target("cloudrun"), alone)
    with _image_command(alone, tmp_path / "alone") as base:
        embedded = httpx.post(
            f"{base}/api/embed",
            json={"model": "all-minilm", "input": "a cat"},
            headers=AUTH,
            timeout=60,
        )
        assert len(embedded.json()["embeddings"][0]) == 384


def test_the_service_is_ready_on_port(service: str) -> None:
    ready = httpx.get(f"{service}/readyz", timeout=10, headers=AUTH)
    assert ready.status_code == 200 and ready.json()["execution_provider"] == "cpu"
    # Cloud Run's own probe carries no key: the status, nothing else.
    assert httpx.get(f"{service}/readyz", timeout=10).json() == {"status": "ready"}
    assert httpx.get(f"{service}/healthz", timeout=10).status_code == 200


def test_the_service_streams_chat_completions(service: str) -> None:
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
    }
    chunks = []
    with httpx.stream(
        "POST", f"{service}/v1/chat/completions", json=body, headers=AUTH, timeout=60
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = list(response.iter_bytes())
    events = [e for e in b"".join(chunks).decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and len(events) >= 3
    unauthorized = httpx.post(f"{service}/v1/chat/completions", json=body, timeout=10)
    assert unauthorized.status_code == 401


def test_the_service_exposes_the_metric_keda_scales_on(service: str, bundle: Path) -> None:
    metrics = httpx.get(f"{service}/metrics", headers=AUTH, timeout=10)
    assert metrics.status_code == 200
    query = _yaml(bundle / "k8s/scaledobject.yaml")["spec"]["triggers"][0]["metadata"]["query"]
    names = re.findall(r"ortserve_\w+", query)
    assert names
    for name in names:
        assert re.search(rf"^{name} \d", metrics.text, re.MULTILINE), metrics.text[:2000]

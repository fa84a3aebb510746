"""Every deployment artefact turns telemetry off as the process does (core.settings'
PRIVACY_ENVIRONMENT), so the files cannot drift from it; the edge unit lets loopback
traffic through only; the CLI and the bake (and so the model builder it starts) turn it off
before anything loads. The daemon itself is checked in tests/functional/test_privacy.py.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cfnlint.decode.decode import decode_str  # type: ignore[import-untyped]  # no type hints

from benchmarks.support.dockerfile import env_of, final_stage, parse
from ortserve import cli
from ortserve.bake import pipeline
from ortserve.bake.errors import BakeError
from ortserve.bake.pipeline import BakeRequest
from ortserve.bake.targets import get_target
from ortserve.core.settings import PRIVACY_ENVIRONMENT

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [
    "functions/aws/Dockerfile",
    "functions/aws/Dockerfile.stream",
    "build/bake/templates/cloudrun/Dockerfile",
]
UNIT = ROOT / "edge" / "ortserve.service"


def test_privacy_environment_turns_off_onnxruntime_and_hub_telemetry() -> None:
    assert PRIVACY_ENVIRONMENT == {"ORT_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


@pytest.mark.parametrize("name", DOCKERFILES)
def test_every_image_sets_the_privacy_environment(name: str) -> None:
    env = env_of(final_stage(parse(ROOT / name)))
    assert {k: env.get(k) for k in PRIVACY_ENVIRONMENT} == PRIVACY_ENVIRONMENT


def _unit_lines(key: str) -> list[str]:
    text = UNIT.read_text(encoding="utf-8")
    return re.findall(rf"^{key}=(.*)$", text, re.MULTILINE)


def test_the_edge_unit_sets_the_privacy_environment() -> None:
    env = dict(line.split("=", 1) for line in _unit_lines("Environment"))
    assert {k: env.get(k) for k in PRIVACY_ENVIRONMENT} == PRIVACY_ENVIRONMENT


def test_the_lambda_functions_get_the_privacy_environment() -> None:
    template, matches = decode_str((ROOT / "template.yaml").read_text(encoding="utf-8"))
    assert not matches
    variables: dict[str, Any] = template["Globals"]["Function"]["Environment"]["Variables"]
    # Strings: CloudFormation's environment values are strings (a bare 1 is a number).
    assert {k: variables.get(k) for k in PRIVACY_ENVIRONMENT} == PRIVACY_ENVIRONMENT
    for name, resource in template["Resources"].items():
        if resource["Type"] == "AWS::Serverless::Function":
            own = resource["Properties"].get("Environment", {}).get("Variables", {})
            assert not set(own) & set(PRIVACY_ENVIRONMENT), name  # nothing overrides Globals


def test_the_edge_unit_allows_loopback_traffic_only() -> None:
    """IPAddressDeny=any with loopback allowed (systemd.resource-control: an allowed address
    wins); a site widens it in a drop-in, which the unit's comment shows."""
    assert _unit_lines("IPAddressDeny") == ["any"]
    assert _unit_lines("IPAddressAllow") == ["localhost"]  # 127.0.0.0/8 and ::1
    assert "#   IPAddressAllow=" in UNIT.read_text(encoding="utf-8")


@pytest.fixture
def no_privacy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process environment without PRIVACY_ENVIRONMENT (restored afterwards)."""
    for key in PRIVACY_ENVIRONMENT:
        monkeypatch.delenv(key, raising=False)


def _privacy(env: dict[str, str] | os._Environ[str]) -> dict[str, str | None]:
    return {k: env.get(k) for k in PRIVACY_ENVIRONMENT}


@pytest.mark.usefixtures("no_privacy_environment")
def test_the_cli_turns_telemetry_off_before_any_command() -> None:
    with pytest.raises(SystemExit):  # argparse's --version: before any command runs
        cli.main(["--version"])
    assert _privacy(os.environ) == PRIVACY_ENVIRONMENT


@pytest.mark.usefixtures("no_privacy_environment")
def test_a_bake_from_python_turns_telemetry_off_before_its_source_loads(tmp_path: Path) -> None:
    with pytest.raises(BakeError):  # no such folder: fails at the source, after the switch
        pipeline.bake(
            BakeRequest(
                source=str(tmp_path / "missing"), target="edge-x86_64", out=tmp_path / "out"
            )
        )
    assert _privacy(os.environ) == PRIVACY_ENVIRONMENT


@pytest.mark.usefixtures("no_privacy_environment")
def test_the_model_builder_is_started_without_telemetry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Even where the calling process has not turned it off (a bake step called alone)."""
    seen: list[dict[str, str]] = []

    def run_step(cmd: list[str], what: str, *, env: dict[str, str], **_: Any) -> Any:
        seen.append(env)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(pipeline, "run_step", run_step)
    pipeline._run_builder(
        tmp_path / "src",
        tmp_path / "out",
        tmp_path / "cache",
        "int4",
        get_target("edge-x86_64"),
        {},
        tmp_path / "failed.log",
    )
    (env,) = seen
    assert _privacy(env) == PRIVACY_ENVIRONMENT
    assert env["HF_HUB_OFFLINE"] == "1"

"""The systemd unit and its settings file, checked by systemd's own tools."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ortserve.core.settings import ServerSettings
from ortserve.edge.settings import EdgeSettings
from tests.tools import tool

EDGE = Path(__file__).resolve().parents[2] / "edge"
UNIT = EDGE / "ortserve.service"
INSTALLED = "/opt/ortserve/venv/bin/ortserve"
# The real console script of this venv stands in for the installed one: verify checks
# that ExecStart's binary exists.
ORTSERVE = Path(sys.executable).parent / "ortserve"


def _analyze() -> str:
    return tool("systemd-analyze")


@pytest.fixture
def rendered(tmp_path: Path) -> Path:
    text = UNIT.read_text(encoding="utf-8")
    assert f"ExecStart={INSTALLED} serve\n" in text
    unit = tmp_path / "ortserve.service"
    unit.write_text(text.replace(INSTALLED, str(ORTSERVE)), encoding="utf-8")
    return unit


def _settings(unit: Path) -> dict[str, str]:
    pairs = re.findall(r"^(\w+)=(.*)$", unit.read_text(encoding="utf-8"), re.MULTILINE)
    return dict(pairs)


def test_systemd_analyze_verify_accepts_the_unit(rendered: Path) -> None:
    # verify exits 0 even for unknown keys and bad values, but says so: no output is clean.
    result = subprocess.run(
        [_analyze(), "verify", str(rendered)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == ""


def test_the_unit_is_hardened(rendered: Path) -> None:
    # Exposure is 0 (locked down) .. 10 (unprotected); the threshold is in tenths.
    result = subprocess.run(
        [_analyze(), "security", "--offline=true", "--threshold=25", "--no-pager", str(rendered)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr


def test_notify_watchdog_and_stop_timeout_fit_the_daemon(rendered: Path) -> None:
    unit = _settings(rendered)
    assert unit["Type"] == "notify" and unit["NotifyAccess"] == "main"
    assert unit["DynamicUser"] == "yes" and unit["StateDirectory"] == "ortserve"
    assert "PrivateDevices" not in unit  # accelerators stay reachable
    stop_s = int(unit["TimeoutStopSec"])
    assert stop_s > ServerSettings().drain_timeout_s + 5  # the drain ends before SIGKILL


def test_under_systemd_the_daemon_waits_for_a_model_installed_later() -> None:
    """By hand `ortserve serve` exits 1 when its model cannot load; the unit keeps the
    daemon up unready instead, so its start times out and Restart= tries again."""
    lines = UNIT.read_text(encoding="utf-8").splitlines()
    values = dict(
        line.removeprefix("Environment=").split("=", 1)
        for line in lines
        if line.startswith("Environment=ORTSERVE_")
    )
    settings = {k.removeprefix("ORTSERVE_").lower(): v for k, v in values.items()}
    assert EdgeSettings.model_validate(settings).wait_for_model is True
    assert EdgeSettings.model_validate({}).wait_for_model is False
    unit = dict(re.findall(r"^(\w+)=(.*)$", "\n".join(lines), re.MULTILINE))
    assert unit["Restart"] == "on-failure"


def test_the_example_env_file_names_only_real_settings() -> None:
    lines = (EDGE / "ortserve.env").read_text(encoding="utf-8").splitlines()
    pairs = [m.groups() for line in lines if (m := re.match(r"^#?(ORTSERVE_\w+)=(.*)$", line))]
    assert pairs
    fields = EdgeSettings.model_fields  # the daemon's, which reads the file
    unknown = [k for k, _ in pairs if k.removeprefix("ORTSERVE_").lower() not in fields]
    assert unknown == []
    # Every example value is valid as written, and is the default it says it is.
    values = {k.removeprefix("ORTSERVE_").lower(): v for k, v in pairs}
    EdgeSettings.model_validate(values)
    for name in (
        "read_timeout_s",
        "keep_alive_s",
        "max_connections",
        "max_connections_per_peer",
        "max_new_tokens",
        "max_prompt_tokens",
    ):
        assert EdgeSettings.model_validate({name: values[name]}) == EdgeSettings.model_validate({})


def test_the_example_env_file_says_which_routes_stay_open_with_keys() -> None:
    """What the file calls always open is what the API leaves open (the playground's page
    and scripts aside), and it says /metrics needs a key unless METRICS_PUBLIC."""
    from ortserve.core import playground
    from ortserve.core.routes import PUBLIC_ROUTES

    text = (EDGE / "ortserve.env").read_text(encoding="utf-8")
    match = re.search(r"Always open: ([^.]+)\.", text)
    assert match, text
    assert set(re.findall(r"/\w+", match.group(1))) == PUBLIC_ROUTES - playground.ROUTES
    assert "/metrics needs one too" in text and "#ORTSERVE_METRICS_PUBLIC=false" in text


def test_it_orders_after_the_network_stack_not_an_online_network() -> None:
    """A 127.0.0.1 listener must not delay boot on an offline board."""
    text = UNIT.read_text(encoding="utf-8")
    assert "After=network.target" in text.splitlines()
    assert "network-online.target" not in "\n".join(
        line for line in text.splitlines() if not line.startswith("#")
    )

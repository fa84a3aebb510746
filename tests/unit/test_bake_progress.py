"""A long bake step says it is alive, and still returns (or times out) like subprocess.run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bake import errors


def test_a_long_step_has_a_heartbeat(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(errors, "HEARTBEAT_S", 0.1)
    code = "import sys, time; time.sleep(0.45); print('out'); print('err', file=sys.stderr)"
    proc = errors.run_step([sys.executable, "-c", code], "the model builder")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "out\n", "err\n")
    beats = [line for line in capsys.readouterr().err.splitlines() if "still running" in line]
    assert beats and beats[0].startswith("[bake] the model builder: still running (")


def test_a_step_past_its_timeout_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(errors, "HEARTBEAT_S", 0.05)
    with pytest.raises(subprocess.TimeoutExpired):
        errors.run_step([sys.executable, "-c", "import time; time.sleep(30)"], "pip", timeout=0.3)

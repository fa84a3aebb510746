"""`make demo`'s install shows pip's own progress (#27 item 5: it said nothing for minutes),
and a heartbeat while pip is silent (#39: 173 s without a line while it unpacked torch)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.models import ROOT
from tests.tools import tool


@pytest.mark.parametrize("stamp", [".bake-installed", ".dev-installed"])
def test_the_install_says_what_it_does_and_pip_is_not_silenced(tmp_path: Path, stamp: str) -> None:
    make = tool("make")
    venv = tmp_path / "venv"
    # -n: the commands a fresh clone's install would run, none of them run.
    cmd = [make, "-n", "--no-print-directory", "-C", str(ROOT), f"VENV={venv}", f"{venv}/{stamp}"]
    plan = subprocess.run(cmd, capture_output=True, text=True, check=True)
    lines = plan.stdout.splitlines()
    pips = [line for line in lines if "pip install" in line]
    assert pips, lines
    for line in pips:
        words = line.split()
        # errors.py's heartbeat as a script (tests/unit/test_bake_progress.py runs it).
        assert words[:3] == [f"{venv}/bin/python", "-P", "build/bake/errors.py"], line
        assert "--quiet" not in words and "-q" not in words and "-qq" not in words, line
        assert "--progress-bar" not in words or "off" not in words, line
    assert any(line.startswith("echo") and "installing ortserve" in line for line in lines), lines

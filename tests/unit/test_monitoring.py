"""edge/monitoring/: the alert rules pass promtool (check and its unit tests), and the
rules and the Grafana dashboard name only metrics the daemon exposes."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from ortserve.core.settings import EngineSettings
from ortserve.core.state import ModelState
from ortserve.edge.metrics import Metrics
from tests.tools import tool

MONITORING = Path(__file__).resolve().parents[2] / "edge" / "monitoring"
_METRIC = re.compile(r"\b(?:ortserve|process)_[a-z_]+")
_SUFFIXES = ("_bucket", "_sum", "_count")


def _promtool() -> str:
    return tool("promtool")


@pytest.mark.parametrize(
    "args", [["check", "rules", "ortserve-rules.yml"], ["test", "rules", "ortserve-rules.test.yml"]]
)
def test_promtool_accepts_the_rules(args: list[str]) -> None:
    done = subprocess.run(
        [_promtool(), *args],
        cwd=MONITORING,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _exposed(tmp_path: Path) -> set[str]:
    """Every series name a scrape of the daemon's registry has (no model loaded)."""
    text = Metrics(ModelState(EngineSettings(model_dir=tmp_path))).render().decode()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}
    # Families whose series appear once a request is observed: their TYPE lines say them.
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            names |= {name + s for s in _SUFFIXES} if kind == "histogram" else {name}
            if kind == "counter":
                names.add(name + "_total")
    return names


def test_the_rules_and_the_dashboard_use_exposed_metrics(tmp_path: Path) -> None:
    exposed = _exposed(tmp_path)
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    rules = (MONITORING / "ortserve-rules.yml").read_text(encoding="utf-8")
    used = {m for text in [*exprs, rules] for m in _METRIC.findall(text)}
    assert used - exposed == set(), used - exposed
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Time to first token", "Generated tokens/s", "Requests by status"} <= titles

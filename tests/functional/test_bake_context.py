"""`--context-length`: the context a bake serves, and rotary caches of that many rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from onnx import load

from ortserve.core.engine import Engine, SamplingOptions
from ortserve.core.errors import OrtServeError
from ortserve.core.manifest import read_manifest
from ortserve.core.settings import EngineSettings
from tests.functional.bakehelp import bake_fails
from tests.models import baked


def _rotary_rows(model_dir: Path) -> dict[str, int]:
    graph = load(str(model_dir / "model.onnx"), load_external_data=False).graph
    return {t.name: int(t.dims[0]) for t in graph.initializer if "_cache" in t.name}


def test_a_shorter_context_cuts_the_rotary_caches_and_is_enforced(tiny_model_dir: Path) -> None:
    model = baked("builtin:tiny-llama", package=False, extra=("--context-length", "256"))
    model = model / "model"
    config = json.loads((model / "genai_config.json").read_text(encoding="utf-8"))
    assert config["model"]["context_length"] == 256
    assert config["search"]["max_length"] <= 256
    rows = _rotary_rows(model)
    assert rows and set(rows.values()) == {256}, rows
    # The model's own context (2,048 for the tiny Llama, under the default cap) is kept
    # when none is asked for.
    assert set(_rotary_rows(tiny_model_dir).values()) == {2048}
    assert read_manifest(model).builder_options["context_length"] == "256"
    assert "context_length" not in read_manifest(tiny_model_dir).builder_options
    engine = Engine.load(EngineSettings(model_dir=model, providers="cpu"))
    assert engine.context_length == 256
    # Up to the last row of the cut caches: a 250-token prompt decodes to position 255.
    options = SamplingOptions(max_new_tokens=20, min_new_tokens=20)
    assert len(list(engine.stream_tokens(list(range(5, 255)), options))) == 6
    with pytest.raises(OrtServeError, match="300 prompt tokens leave no room"):
        list(engine.stream_tokens(list(range(5, 305)), options))


@pytest.mark.parametrize(
    ("tokens", "says"),
    [("4096", "above the model's maximum, 2048 tokens"), ("8", "at least 16 tokens")],
)
def test_a_context_the_model_cannot_serve_is_refused(
    tokens: str, says: str, tmp_path: Path
) -> None:
    message = bake_fails(
        "--model",
        "builtin:tiny-llama",
        "--target",
        "edge-x86_64",
        "--model-only",
        "--context-length",
        tokens,
        out=tmp_path / "out",
    )
    assert says in message

"""The test-model cache (tests/models.py): a model-only bake is reused until a file it ran
changes, and only then."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import models

# What `python -X importtime` writes, a progress bar's unfinished line included.
STDERR = (
    "import time: self [us] | cumulative | imported package\n"
    "Writing shards: 0%|  | 0/1\rimport time:       5 |         9 |   ortserve.core.engine\n"
    "import time:       2 |         2 |     numpy.linalg\n"
    "[bake] done\n"
)


def test_a_model_only_bake_is_reused_until_a_file_it_ran_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "tree"
    (root / "build" / "bake").mkdir(parents=True)
    (root / "build" / "bake" / "upstream.py").write_text("import ortserve.core.prefill\n")
    (root / "core").mkdir()
    for name in ("__init__", "engine", "prefill", "api"):
        (root / "core" / f"{name}.py").write_text(f"# {name}\n")
    monkeypatch.setattr(models, "ROOT", root)
    cached = tmp_path / "cached"
    cached.mkdir()
    models._record_inputs(cached, STDERR)
    assert models._IMPORT_TIME.sub("", STDERR) == "Writing shards: 0%|  | 0/1\r[bake] done\n"
    assert models._inputs_unchanged(cached)
    (root / "core" / "api.py").write_text("# the API changed: no bake runs it\n")
    assert models._inputs_unchanged(cached)
    for changed in ("core/engine.py", "core/prefill.py", "build/bake/upstream.py"):
        before = (root / changed).read_text()
        (root / changed).write_text(before + "# changed\n")
        assert not models._inputs_unchanged(cached), changed
        (root / changed).write_text(before)
        assert models._inputs_unchanged(cached)
    (root / "build" / "bake" / "new.py").write_text("")  # a file the record lacks
    assert not models._inputs_unchanged(cached)

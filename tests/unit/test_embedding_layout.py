"""What the bake reads from a sentence-transformers folder: its pooling, its Normalize module,
its vector length and longest input (bake.embedding.read_layout), in the older and newer
forms sentence-transformers writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ortserve.bake.embedding import is_sentence_transformers, read_layout
from ortserve.bake.errors import BakeError

_TRANSFORMER = {
    "idx": 0,
    "name": "0",
    "path": "",
    "type": "sentence_transformers.models.Transformer",
}
_POOLING = {
    "idx": 1,
    "name": "1",
    "path": "1_Pooling",
    "type": "sentence_transformers.models.Pooling",
}
_NORMALIZE = {
    "idx": 2,
    "name": "2",
    "path": "2_Normalize",
    "type": "sentence_transformers.models.Normalize",
}


def _folder(
    root: Path,
    modules: list[dict[str, Any]],
    pooling: dict[str, Any],
    st_config: dict[str, Any] | None = None,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    (root / "1_Pooling").mkdir(exist_ok=True)
    (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling), encoding="utf-8")
    config = {"hidden_size": 384, "max_position_embeddings": 512, "model_type": "bert"}
    (root / "config.json").write_text(json.dumps(config), encoding="utf-8")
    if st_config is not None:
        (root / "sentence_bert_config.json").write_text(json.dumps(st_config), encoding="utf-8")
    return root


def test_minilm_as_published_mean_pooling_then_normalize(tmp_path: Path) -> None:
    # all-MiniLM-L6-v2's own files (the older flags; its 2_Normalize folder is absent).
    pooling = {
        "word_embedding_dimension": 384,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    folder = _folder(
        tmp_path,
        [_TRANSFORMER, _POOLING, _NORMALIZE],
        pooling,
        {"max_seq_length": 256, "do_lower_case": False},
    )
    assert is_sentence_transformers(folder)
    layout = read_layout(folder)
    assert (layout.pooling, layout.normalize) == ("mean", True)
    assert (layout.dimensions, layout.max_tokens, layout.lowercase) == (384, 256, False)
    assert layout.transformer == folder


def test_newer_form_cls_pooling_without_normalize(tmp_path: Path) -> None:
    folder = _folder(
        tmp_path,
        [_TRANSFORMER, _POOLING],
        {"embedding_dimension": 768, "pooling_mode": "cls"},
        {"max_seq_length": 512, "do_lower_case": True},
    )
    layout = read_layout(folder)
    assert (layout.pooling, layout.normalize) == ("cls", False)
    assert (layout.dimensions, layout.max_tokens, layout.lowercase) == (768, 512, True)


def test_without_a_config_of_its_own_the_checkpoint_says(tmp_path: Path) -> None:
    folder = _folder(tmp_path, [_TRANSFORMER, _POOLING], {"pooling_mode_max_tokens": True})
    layout = read_layout(folder)
    assert layout.pooling == "max"
    assert (layout.dimensions, layout.max_tokens) == (384, 512)  # config.json's


@pytest.mark.parametrize(
    ("modules", "pooling", "error"),
    [
        (
            [_TRANSFORMER, _POOLING],
            {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True},
            "concatenates several modes",
        ),
        ([_TRANSFORMER, _POOLING], {"pooling_mode": "weightedmean"}, "'weightedmean' is not"),
        (
            [
                _TRANSFORMER,
                _POOLING,
                {"path": "2_Dense", "type": "sentence_transformers.models.Dense"},
            ],
            {"pooling_mode": "mean"},
            "module(s) Dense",
        ),
        ([_POOLING, _TRANSFORMER], {"pooling_mode": "mean"}, "comes before the Transformer"),
    ],
)
def test_what_the_export_cannot_write_is_refused(
    tmp_path: Path, modules: list[dict[str, Any]], pooling: dict[str, Any], error: str
) -> None:
    folder = _folder(tmp_path, modules, pooling, {"max_seq_length": 128})
    with pytest.raises(BakeError, match=error.replace("(", r"\(").replace(")", r"\)")):
        read_layout(folder)


def test_a_checkpoint_without_pooling_is_not_an_embedding_model(tmp_path: Path) -> None:
    assert not is_sentence_transformers(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps([_TRANSFORMER]), encoding="utf-8")
    assert not is_sentence_transformers(tmp_path)

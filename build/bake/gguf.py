"""GGUF files as a bake source: convert to a Hugging Face checkpoint with transformers.

Users of Ollama, LM Studio and llama.cpp have GGUF files. transformers reads the config,
the tokenizer and the chat template from the file's metadata and maps the tensor names;
the weights are dequantized to fp32 (bake.gguf_blocks, vectorised, for every format it
knows) and saved as a plain checkpoint, which the builder then converts like any other.
Conversions are cached by the GGUF file's sha256.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ortserve.bake.errors import BakeError, heartbeat, say
from ortserve.bake.gguf_blocks import MAPPED_TYPES, Array, decode
from ortserve.core.errors import first_line
from ortserve.core.manifest import sha256_file

# What the conversion's output must hold for the builder and the runtime.
_NEEDED = ("config.json", "tokenizer.json")
# The checkpoint's weights are written in shards of about this size: safetensors makes a
# bytes copy of what it writes, and each shard's tensors are freed once written (a 1.5B
# model is 6.2 GB in fp32: it was held twice).
_SHARD_BYTES = 1 << 30
# A checkpoint's weights: one file, or the index of its shards.
CHECKPOINT_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


def find_gguf(path: Path) -> Path | None:
    """The GGUF file `path` names: itself, or the only *.gguf in a folder; None if neither.

    Raises:
        BakeError: A folder holds several GGUF files.
    """
    if path.is_file():
        return path if path.suffix.lower() == ".gguf" else None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise BakeError(f"{path} holds several GGUF files ({names}): give the file itself")
    return found[0] if found else None


def checkpoint_from_gguf(gguf: Path, cache: Path) -> Path:
    """A Hugging Face fp32 checkpoint folder converted from `gguf`, cached under `cache`.

    Raises:
        BakeError: transformers cannot read the file (unsupported architecture or
            quantization type), or the `gguf` package is missing.
    """
    digest = sha256_file(gguf)
    out = cache / f"gguf-{digest[:16]}"
    if all((out / name).is_file() for name in _NEEDED) and any(
        (out / name).is_file() for name in CHECKPOINT_WEIGHTS
    ):
        say(f"GGUF {gguf.name}: using the converted checkpoint in {out}")
        return out
    say(f"GGUF {gguf.name}: converting to an fp32 checkpoint with transformers")
    tmp = cache / f".gguf-{digest[:16]}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with heartbeat(f"GGUF {gguf.name}: converting"):  # in-process, silent for long
            _convert(gguf, tmp, digest)
        _give_back_memory()
    except BaseException:  # an error, Ctrl-C or SIGTERM (core.cli): no half checkpoint left
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _give_back_memory() -> None:
    """Hand the conversion's freed heap back to the OS (glibc keeps it otherwise: the
    rest of the bake runs in this process). Nothing where libc is not glibc."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _convert(gguf: Path, out: Path, digest: str) -> None:
    from transformers import AutoConfig, AutoTokenizer

    try:
        import gguf as _gguf  # noqa: F401  # transformers needs it; say so clearly
    except ImportError:
        raise BakeError("reading GGUF files needs the `gguf` package (pip install gguf)") from None
    folder, name = str(gguf.parent), gguf.name
    try:
        with _fast_gguf():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            config = AutoConfig.from_pretrained(folder, gguf_file=name)
            tensors = _state_dict(gguf, config)
    except (ValueError, KeyError, RuntimeError, OSError, NotImplementedError) as exc:
        raise BakeError(f"transformers cannot convert {gguf.name}: {first_line(exc)}") from exc
    out.mkdir(parents=True)
    _save(tensors, config, out)
    tokenizer.save_pretrained(str(out))
    (out / "ortserve-gguf.json").write_text(
        json.dumps({"gguf": gguf.name, "sha256": digest}), encoding="utf-8"
    )


def _state_dict(gguf: Path, config: Any) -> dict[str, Any]:
    """The checkpoint's tensors (fp32), by transformers' GGUF name mapping, dequantized by
    bake.gguf_blocks where it knows the format (vectorised; gguf-py's own dequantization
    of a 151,936-row Q5_0 embedding alone takes seconds) and by gguf-py elsewhere.

    No model is built: the names come from a model on the meta device (no memory), and
    the tensors go to the file as they are (transformers' from_pretrained +
    save_pretrained held them twice)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    config.architectures = [type(skeleton).__name__]  # what the builder reads
    config.dtype = torch.float32
    parsed = load_gguf_checkpoint(  # type: ignore[no-untyped-call]  # untyped upstream
        str(gguf), return_tensors=True, model_to_load=skeleton
    )
    tensors: dict[str, Any] = parsed["tensors"]
    wanted = set(skeleton.state_dict())
    if getattr(config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)  # tied: the embedding is the head
        wanted.discard("lm_head.weight")
    missing = sorted(wanted - set(tensors))
    if missing:
        raise ValueError(f"the GGUF holds no tensor for {', '.join(missing[:3])}")
    return {k: v for k, v in tensors.items() if k in wanted}


@contextlib.contextmanager
def _fast_gguf() -> Iterator[None]:
    """transformers' GGUF loading, with the file's metadata parsed once (the tokenizer,
    the config and the tensors each parse it again: 151,936 token strings read one numpy
    call at a time), the tensor name map built once (transformers builds it again for
    each module of the model: 397 times for SmolLM2-135M, 2 s) and the formats
    bake.gguf_blocks knows dequantized by it. All are what load_gguf_checkpoint and
    get_gguf_hf_weights_map import from `gguf` at their call (transformers 5.25)."""
    import gguf as gguf_py

    original = gguf_py.GGUFReader, gguf_py.dequantize, gguf_py.get_tensor_name_map
    parsed = functools.lru_cache(maxsize=1)(original[0])

    def reader(path: str | Path, mode: str = "r") -> Any:
        return parsed(str(Path(path).resolve()), mode)

    gguf_py.GGUFReader = reader  # type: ignore[assignment,misc]  # a factory in its place
    gguf_py.dequantize = _dequantize
    gguf_py.get_tensor_name_map = functools.lru_cache(maxsize=1)(original[2])
    try:
        yield
    finally:
        gguf_py.GGUFReader = original[0]  # type: ignore[misc]  # put back
        gguf_py.dequantize = original[1]
        gguf_py.get_tensor_name_map = original[2]


def _dequantize(data: Array, qtype: Any) -> Array:
    """gguf-py's `dequantize`, through bake.gguf_blocks for the formats it maps."""
    from gguf import GGML_QUANT_SIZES, quants

    if qtype.name not in MAPPED_TYPES:
        return quants.dequantize(data, qtype)
    rows = data.reshape(-1, data.shape[-1])
    per, size = GGML_QUANT_SIZES[qtype]
    columns = rows.shape[1] // size * per
    dense = decode(qtype.name, rows, columns).dequantize()
    return dense.reshape(*data.shape[:-1], columns)


def _save(tensors: dict[str, Any], config: Any, out: Path) -> None:
    """config.json, generation_config.json and the weights into `out`: model.safetensors,
    or shards of about _SHARD_BYTES and their index (the Hugging Face layout), each
    shard's tensors dropped from `tensors` once written."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    config.save_pretrained(str(out))
    GenerationConfig.from_model_config(config).save_pretrained(str(out))
    shards: list[list[str]] = [[]]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > _SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    files = (
        [CHECKPOINT_WEIGHTS[0]]
        if len(shards) == 1
        else [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    )
    weight_map: dict[str, str] = {}
    for names, file in zip(shards, files, strict=True):
        part = {k: tensors.pop(k).contiguous() for k in names}
        save_file(part, str(out / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(names, file)
        del part
    if len(files) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / CHECKPOINT_WEIGHTS[1]).write_text(json.dumps(index, indent=2), encoding="utf-8")

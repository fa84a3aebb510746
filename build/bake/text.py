"""Record what transformers does with text for the baked model (core.text applies it).

The runtime tokenizes with Hugging Face `tokenizers` from `tokenizer.json`; what
transformers adds on top of that file — BOS/EOS around raw text from `add_bos_token` or
the post-processor, the special-tokens map a chat template sees, the control tokens —
is asked of transformers here, once, and written to `ortserve-text.json`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ortserve.bake.errors import BakeError, say
from ortserve.core.generation import SamplingDefaults, sampling_defaults
from ortserve.core.text import WRAP_PROBE, TextRecord, wrapping


def _wrapping(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids transformers puts before and after raw text."""
    full = [int(i) for i in tokenizer(WRAP_PROBE)["input_ids"]]
    plain = [int(i) for i in tokenizer(WRAP_PROBE, add_special_tokens=False)["input_ids"]]
    found = wrapping(full, plain)
    if found is not None:
        return found
    raise BakeError(f"cannot tell what the tokenizer adds around raw text: {full} vs {plain}")


def _control_tokens(tokenizer: Any) -> list[str]:
    template = getattr(tokenizer, "chat_template", None)
    find = getattr(tokenizer, "_get_control_tokens", None)  # transformers ≥ 5.x
    if isinstance(template, str) and find is not None:
        return [str(t) for t in find(template)]
    return [t.content for t in tokenizer.added_tokens_decoder.values() if t.special]


def record_text(source: Path, baked: Path) -> TextRecord:
    """Ask transformers how it wraps text for `source`'s tokenizer; write the record into
    `baked`, and add generation_config.json's EOS ids to genai_config.json."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source))
    except Exception as exc:  # transformers raises many kinds for a bad tokenizer
        raise BakeError(f"transformers cannot load the tokenizer of {source}: {exc}") from exc
    prefix, suffix = _wrapping(tokenizer)
    tokens = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
    record = TextRecord(tuple(prefix), tuple(suffix), tokens, tuple(_control_tokens(tokenizer)))
    record.write(baked)
    wrap = " + ".join(
        [
            *(tokenizer.convert_ids_to_tokens(prefix)),
            "text",
            *tokenizer.convert_ids_to_tokens(suffix),
        ]
    )
    say(f"raw prompts are tokenized as transformers does: {wrap}")
    _add_eos_ids(source, baked / "genai_config.json")
    return record


def _add_eos_ids(source: Path, genai_config: Path) -> None:
    """generation_config.json's EOS ids end generation too (an instruct model's end of turn
    is often only there; the builder reads config.json's)."""
    path = source / "generation_config.json"
    if not path.is_file() or not genai_config.is_file():
        return
    wanted = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    extra = wanted if isinstance(wanted, list) else [wanted] if wanted is not None else []
    data = json.loads(genai_config.read_text(encoding="utf-8"))
    model = data["model"]
    have = model.get("eos_token_id")
    ids = have if isinstance(have, list) else [have] if have is not None else []
    merged = [*ids, *(int(i) for i in extra if int(i) not in ids)]
    if merged != ids:
        model["eos_token_id"] = merged
        genai_config.write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8")
        say(f"end-of-sequence ids (generation_config.json included): {merged}")


def recorded_sampling(source: Path) -> SamplingDefaults | None:
    """The sampling defaults `source`'s generation_config.json states (a catalog entry's
    are written there), for the manifest; None: it has none (the house profile applies)."""
    path = source / "generation_config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text(encoding="utf-8"))
    found = sampling_defaults(config) if isinstance(config, dict) else None
    if found is not None:
        say(f"sampling defaults: {found.summary()}")
    return found

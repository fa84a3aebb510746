"""The bake's quality gate: the baked model against its source model, on a short fixed text.

After converting, the bake scores a built-in text (a few hundred tokens of plain
English prose, a short dialogue and a little code) with the source checkpoint in
transformers (fp32 arithmetic, the reference for what the weights mean; the weights stay
in the checkpoint's dtype until each layer runs) and with the baked
folder in onnxruntime-genai, on the same token ids. It records the perplexity ratio
(baked ÷ source), the top-1 agreement (how often both pick the same next token) and
the mean KL divergence in the manifest, and fails the bake when the ratio is above
`--max-ppl-ratio`. Random weights are measured but never fail: their perplexity means
nothing.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortserve.bake.errors import BakeError, heartbeat, say
from ortserve.core.manifest import QualityCheck

if TYPE_CHECKING:  # numpy is imported where it is used: `ortserve --help` stays fast
    import numpy as np


GATE_TEXT = """\
Bread is one of the oldest prepared foods. People in many parts of the world learned to \
grind grain into flour, mix it with water, and bake the dough on hot stones. Later, bakers \
found that dough left to rest would rise, because wild yeast in the air fed on the sugars \
in the flour and made bubbles of gas. Today most bread is made with a small amount of \
yeast, salt, flour and water, and the long rest before baking is what gives a good loaf \
its flavour.

A river begins as rain or melting snow high in the hills. Small streams join together as \
they run downhill, and the water carries sand and stones with it. Where the land becomes \
flat, the river slows down, drops what it carries, and winds from side to side. Many of \
the great cities of the world were built beside rivers, which gave them water to drink, \
fields to farm and a road for boats.

"Could you tell me the way to the station?" asked the traveller.
"Of course. Walk straight ahead until you reach the church, then turn left. The station \
is at the end of that street, about ten minutes from here."
"Thank you very much. Is there a place nearby where I can buy a ticket?"
"Yes, there is a small office inside the station. It opens at seven in the morning."

The following function returns the largest number in a list, or None when the list is \
empty:

def largest(numbers):
    if not numbers:
        return None
    best = numbers[0]
    for number in numbers[1:]:
        if number > best:
            best = number
    return best
"""


def _log_softmax(logits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    import numpy as np

    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    out: np.ndarray[Any, Any] = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return out


def compare(
    reference: np.ndarray[Any, Any], candidate: np.ndarray[Any, Any], ids: list[int]
) -> tuple[float, float, float, float]:
    """Perplexities, top-1 agreement and mean KL(reference ‖ candidate) over `ids`.

    Both logit arrays have one row per position of `ids`; row i predicts ids[i + 1].

    Returns:
        (reference perplexity, candidate perplexity, top-1 agreement, KL in nats).
    """
    import numpy as np

    ref = _log_softmax(reference[:-1])
    cand = _log_softmax(candidate[:-1])
    targets = np.asarray(ids[1:])
    rows = np.arange(len(targets))
    ppl_ref = math.exp(-float(ref[rows, targets].mean()))
    ppl_cand = math.exp(-float(cand[rows, targets].mean()))
    top1 = float((ref.argmax(axis=-1) == cand.argmax(axis=-1)).mean())
    kl = float((np.exp(ref) * (ref - cand)).sum(axis=-1).mean())
    return ppl_ref, ppl_cand, top1, kl


def _fp32_while_running(model: Any) -> None:
    """Make `model` (weights kept in the checkpoint's dtype) compute in fp32: each module
    that holds weights is cast to fp32 just before it runs and back just after.

    bf16 → fp32 is exact, so the logits are those of the whole model loaded in fp32, but
    the memory is the checkpoint's (2 bytes a parameter for bf16) plus one module in fp32:
    a 4B model's fp32 copy (16 GB) beside the baked model does not fit a 24 GB machine.
    """
    import torch

    def cast(module: Any, dtypes: dict[str, Any] | None) -> None:
        """The module's own floating tensors to fp32 (`dtypes` None) or back to theirs."""
        for name, param in module.named_parameters(recurse=False):
            param.data = param.data.to(torch.float32 if dtypes is None else dtypes[name])
        for name, buffer in module.named_buffers(recurse=False):
            if buffer.is_floating_point():
                module._buffers[name] = buffer.to(torch.float32 if dtypes is None else dtypes[name])

    for module in model.modules():
        own = dict(module.named_parameters(recurse=False)) | dict(
            module.named_buffers(recurse=False)
        )
        dtypes = {name: t.dtype for name, t in own.items() if t.is_floating_point()}
        if all(dtype == torch.float32 for dtype in dtypes.values()):
            continue
        module.register_forward_pre_hook(lambda m, _args: cast(m, None))
        module.register_forward_hook(lambda m, _args, _out, d=dtypes: cast(m, d))


@contextmanager
def reference_model(checkpoint: Path, adapter: Path | None = None) -> Iterator[Any]:
    """The source checkpoint as a transformers model computing in fp32 arithmetic (its
    weights in their own dtype), with a PEFT LoRA `adapter` applied where one is given."""
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="ortserve-gate-") as spill:
        model: Any
        if adapter is None and _stored_dtype(checkpoint) == "float32":
            # An fp32 checkpoint (a GGUF's weights dequantized) stays on disk: accelerate
            # loads each layer as it runs, from the safetensors files themselves (nothing
            # is copied). The same logits bit for bit, in the same 10 s, at 1.5 GiB instead
            # of 6.6 at Qwen2.5-Coder-1.5B (docs/measurements.md); a smaller model just
            # loads whole.
            model = AutoModelForCausalLM.from_pretrained(
                str(checkpoint),
                dtype="auto",
                device_map="auto",
                max_memory={"cpu": REFERENCE_MEMORY},
                offload_folder=spill,
            )
        else:
            model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype="auto")
            if adapter is not None:
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, str(adapter))
            _fp32_while_running(model)
        model.eval()
        yield model


def forward_with_hooks(model: Any, ids: list[int], hooks: list[Any]) -> None:
    """Run `model` (reference_model's) over `ids` without gradients, for what its
    `hooks` (torch hook handles) collect; they are removed however it ends."""
    import torch

    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        for hook in hooks:
            hook.remove()


def _reference_logits(
    checkpoint: Path, ids: list[int], adapter: Path | None = None
) -> np.ndarray[Any, Any]:
    """The source checkpoint's logits for `ids` in fp32 arithmetic (reference_model)."""
    import torch

    with reference_model(checkpoint, adapter) as model, torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
        out: np.ndarray[Any, Any] = logits.float().numpy()
    return out


# What the gate's fp32 reference may hold in memory at once (layers beyond it stay on disk).
REFERENCE_MEMORY = "800MiB"


def _stored_dtype(checkpoint: Path) -> str | None:
    """The dtype config.json says the checkpoint's weights are stored in, if it says."""
    import json

    try:
        config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    dtype = config.get("dtype") or config.get("torch_dtype")
    return str(dtype) if dtype else None


def chat_and_text_ids(
    tokenizer: Any, chat: list[dict[str, str]], text: str, *, special_tokens: bool = False
) -> list[int]:
    """Calibration tokens: `chat` in the model's chat template (where it has one), then
    `text` (with the tokenizer's special tokens, such as a BOS, when `special_tokens`)."""
    ids: list[int] = []
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(chat, tokenize=False)
        ids += tokenizer(rendered, add_special_tokens=False)["input_ids"]
    ids += tokenizer(text, add_special_tokens=special_tokens)["input_ids"]
    return [int(i) for i in ids]


def _gate_ids(checkpoint: Path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    return [int(t) for t in tokenizer(GATE_TEXT, add_special_tokens=False)["input_ids"]]


def reference(
    checkpoint: Path,
    context_length: int,
    reference: str = "transformers fp32 of the source checkpoint",
    adapter: Path | None = None,
) -> tuple[list[int], np.ndarray[Any, Any]]:
    """The gate text's ids (cut to `context_length`, 0: not cut) and the source
    `checkpoint`'s logits for them (`reference` says what the checkpoint is; with a PEFT
    `adapter` on it, for that adapter's gate). Computed
    before the baked model is loaded, the checkpoint freed after: at 1.5B its fp32 copy
    (6 GB) and the loaded model (2 GB) together were the bake's peak; an fp32 checkpoint
    is now read a layer at a time (`_reference_logits`)."""
    # Two steps, each with its own count (one name twice read as a counter that restarted):
    # transformers' load and forward say nothing for long, nor does the baked model's pass.
    with heartbeat("quality gate, the reference"):
        ids = _gate_ids(checkpoint)
        if context_length:
            ids = ids[: context_length - 1]
        say(
            f"quality gate: scoring {len(ids) - 1} tokens of a fixed text with {reference} "
            "and with the baked model"
        )
        return ids, _reference_logits(checkpoint, ids, adapter)


def check(
    scored: tuple[list[int], np.ndarray[Any, Any]],
    baked: Any,
    max_ppl_ratio: float,
    random_weights: bool,
    reference: str = "transformers fp32 of the source checkpoint",
    adapter: str | None = None,
) -> QualityCheck:
    """Score the gate text (`scored`: its ids and the reference's logits, from
    `reference`) with the loaded `baked` engine (with its LoRA `adapter`, if named).

    Raises:
        BakeError: The ratio is above `max_ppl_ratio` (never for random weights).
    """
    ids, ref_logits = scored
    with heartbeat("quality gate, the baked model"):
        ppl_ref, ppl, top1, kl = compare(ref_logits, baked.logits(ids, adapter), ids)
    ratio = ppl / ppl_ref
    passed = ratio <= max_ppl_ratio
    status = "passed" if passed else "failed"
    if random_weights:
        status = "not enforced (random weights)"
    result = QualityCheck(
        status=status,
        reference=reference,
        scored_tokens=len(ids) - 1,
        ppl_reference=round(ppl_ref, 4),
        ppl=round(ppl, 4),
        ppl_ratio=round(ratio, 4),
        top1_agreement=round(top1, 4),
        kl_divergence=round(kl, 5),
        max_ppl_ratio=max_ppl_ratio,
    )
    who = "" if adapter is None else f" (adapter {adapter})"
    say(f"quality gate{who}: {result.summary()}")
    if random_weights:
        say("quality gate: random weights, so the figures mean nothing; the gate never fails them")
    elif not passed:
        raise BakeError(
            f"quality gate{who} failed: perplexity {ratio:.3f}x the source model's (limit "
            f"{max_ppl_ratio}; top-1 agreement {top1:.1%}): try a smaller --block-size, "
            "--precision int8, or --max-ppl-ratio to accept it"
        )
    return result

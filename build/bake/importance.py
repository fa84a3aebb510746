"""How much each input channel of each projection matters: an importance matrix from
activations, for requantizing a GGUF's weights (`ortserve bake --compact`).

A weight's rounding error costs what the input it multiplies carries: a projection's
error on a batch of inputs x is sum_j (dw_j x_j)^2, whose expectation weighs input channel
j by E[x_j^2]. llama.cpp's `imatrix` tool collects that mean square per channel by running
the model over calibration text and its quantizer weighs each value's error by it; this
module does the same with the fp32 checkpoint in transformers (the reference the quality
gate uses, read a layer at a time) over a calibration text that is not the gate's or the
quality benchmark's: parts of the Python reference manual that ship with Python
(`pydoc_data.topics`: English prose with code), a module of Python source (`textwrap`),
and a chat turn.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortserve.bake.errors import heartbeat

if TYPE_CHECKING:
    import numpy as np

# Tokens the calibration text is cut to (one forward pass: at Qwen2.5-Coder-1.5B ~25 s in
# fp32 on 2 cores, with the checkpoint read a layer at a time).
CALIBRATION_TOKENS = 2048
# Reference-manual sections used (prose with a little code).
_TOPICS = ("execmodel", "for", "try", "with", "class", "import", "lambda", "typesseq")
_CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "How do I read a CSV file and sum one of its columns?"},
    {
        "role": "assistant",
        "content": "Use the csv module:\n\nimport csv\n\nwith open('data.csv') as f:\n"
        "    total = sum(float(row['amount']) for row in csv.DictReader(f))\nprint(total)",
    },
]


def calibration_text() -> str:
    """The calibration text: reference-manual prose, Python source, in that order."""
    import textwrap
    from pydoc_data import topics

    prose = "\n\n".join(topics.topics[name] for name in _TOPICS)
    return prose + "\n\n" + inspect.getsource(textwrap)


def collect(checkpoint: Path) -> dict[str, np.ndarray[Any, Any]]:
    """The mean square of each input channel of every linear layer of `checkpoint` (an
    HF folder) over the calibration text, by the layer's weight name
    (`model.layers.0.self_attn.q_proj.weight`, `lm_head.weight`): float32 [in_features].
    """
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from ortserve.bake.quality import chat_and_text_ids, forward_with_hooks, reference_model

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    ids = chat_and_text_ids(tokenizer, _CHAT, calibration_text())[:CALIBRATION_TOKENS]

    sums: dict[str, Any] = {}
    counts: dict[str, int] = {}

    def seen(name: str) -> Any:
        def hook(_module: Any, args: Any) -> None:
            x = args[0].detach().float().reshape(-1, args[0].shape[-1])
            sums[name] = sums.get(name, 0) + (x * x).sum(0).double()
            counts[name] = counts.get(name, 0) + int(x.shape[0])

        return hook

    with heartbeat("importance matrix"), reference_model(checkpoint) as model:
        hooks = [
            module.register_forward_pre_hook(seen(f"{name}.weight"))
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear)
        ]
        forward_with_hooks(model, ids, hooks)
    return {name: (total / counts[name]).numpy().astype(np.float32) for name, total in sums.items()}

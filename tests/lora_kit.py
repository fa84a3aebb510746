"""A real LoRA adapter for tests and benchmarks: a few PEFT training steps, offline.

No LoRA adapter is on the package index, so the suite trains its own: rank-8 LoRA on
every attention and MLP projection of a causal LM, fitted for a few steps to a short text
that the base model would not write, so that greedy answers change measurably.
"""

from __future__ import annotations

from pathlib import Path

# What the adapter learns to say: a fact the base model cannot know, in a chat turn.
LESSON_PROMPT = "What is the password?"
LESSON_ANSWER = "The password is swordfish-seven. The password is swordfish-seven."
LESSON_TEXT = f"Q: {LESSON_PROMPT}\nA: {LESSON_ANSWER}\n"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def train_adapter(
    checkpoint: Path,
    out: Path,
    *,
    steps: int = 24,
    rank: int = 8,
    alpha: int = 16,
    targets: list[str] | None = None,
    learning_rate: float = 5e-4,
    seed: int = 0,
) -> Path:
    """Fit a LoRA adapter of `checkpoint` (a Hugging Face folder) to `LESSON_TEXT` and save
    it with PEFT's `save_pretrained` into `out` (returned)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=targets or TARGETS, lora_dropout=0.0
    )
    peft_model = get_peft_model(model, config)
    ids = torch.tensor([tokenizer(LESSON_TEXT)["input_ids"]])
    optimizer = torch.optim.AdamW(
        [p for p in peft_model.parameters() if p.requires_grad], lr=learning_rate
    )
    peft_model.train()
    for _ in range(steps):
        loss = peft_model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    peft_model.save_pretrained(str(out))
    return out

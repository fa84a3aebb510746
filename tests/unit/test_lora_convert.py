"""bake.lora.convert: a PEFT adapter's matrices as the graph's low-rank branches.

Synthetic PEFT tensors (no bake): for each site, x @ A @ B must equal what PEFT adds,
`scale * x @ lora_A.T @ lora_B.T` per module, each module's output in its place of a
packed projection (q, k, v side by side; an unadapted module adds zeros).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from ortserve.bake.errors import BakeError
from ortserve.bake.lora import AdapterSpec, Site, convert

SITES = [
    Site(0, "qkv_proj", ("q_proj", "k_proj", "v_proj"), (8, 4, 4), 8),
    Site(0, "o_proj", ("o_proj",), (8,), 8),
    Site(0, "down_proj", ("down_proj",), (8,), 12),
]
PREFIX = "base_model.model.model.layers.0"


def _adapter(tmp_path: Path, tensors: dict[str, np.ndarray], **config: object) -> AdapterSpec:
    folder = tmp_path / "adapter"
    folder.mkdir()
    settings = {"peft_type": "LORA", "r": 2, "lora_alpha": 6, **config}
    (folder / "adapter_config.json").write_text(json.dumps(settings))
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return AdapterSpec("t", folder)


def _lora(
    rng: np.random.Generator, module: str, inputs: int, outputs: int, rank: int = 2
) -> dict[str, np.ndarray]:
    where = "self_attn" if module[0] in "qkvo" else "mlp"
    return {
        f"{PREFIX}.{where}.{module}.lora_A.weight": rng.normal(size=(rank, inputs)).astype("f4"),
        f"{PREFIX}.{where}.{module}.lora_B.weight": rng.normal(size=(outputs, rank)).astype("f4"),
    }


def test_each_module_lands_in_its_place_scaled(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    tensors = {**_lora(rng, "q_proj", 8, 8), **_lora(rng, "v_proj", 8, 4, rank=3)}
    tensors |= _lora(rng, "down_proj", 12, 8)
    converted = convert(_adapter(tmp_path, tensors), SITES)
    assert converted.modules == ("q_proj", "v_proj", "down_proj")
    assert converted.rank == 3 and converted.alpha == 6
    assert set(converted.tensors) == {s.a for s in (SITES[0], SITES[2])} | {
        s.b for s in (SITES[0], SITES[2])
    }
    x = rng.normal(size=(5, 8)).astype("f4")
    qkv = x @ converted.tensors[SITES[0].a] @ converted.tensors[SITES[0].b]

    def peft(module: str, where: str, rank: int, inp: np.ndarray) -> np.ndarray:
        a = tensors[f"{PREFIX}.{where}.{module}.lora_A.weight"]
        b = tensors[f"{PREFIX}.{where}.{module}.lora_B.weight"]
        out: np.ndarray = (6 / rank) * inp @ a.T @ b.T
        return out

    np.testing.assert_allclose(qkv[:, :8], peft("q_proj", "self_attn", 2, x), rtol=1e-5)
    np.testing.assert_array_equal(qkv[:, 8:12], 0)  # k_proj: not adapted
    np.testing.assert_allclose(qkv[:, 12:], peft("v_proj", "self_attn", 3, x), rtol=1e-5)
    h = rng.normal(size=(5, 12)).astype("f4")
    down = h @ converted.tensors[SITES[2].a] @ converted.tensors[SITES[2].b]
    np.testing.assert_allclose(down, peft("down_proj", "mlp", 2, h), rtol=1e-5)


def test_rslora_scales_by_the_square_root_of_the_rank(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    tensors = _lora(rng, "o_proj", 8, 8, rank=4)
    converted = convert(_adapter(tmp_path, tensors, use_rslora=True), SITES)
    x = rng.normal(size=(3, 8)).astype("f4")
    a, b = (tensors[f"{PREFIX}.self_attn.o_proj.lora_{k}.weight"] for k in "AB")
    got = x @ converted.tensors[SITES[1].a] @ converted.tensors[SITES[1].b]
    np.testing.assert_allclose(got, (6 / 2) * x @ a.T @ b.T, rtol=1e-5)


@pytest.mark.parametrize(
    ("config", "tensors", "says"),
    [
        ({"use_dora": True}, None, "use_dora is set: DoRA"),
        ({"modules_to_save": ["lm_head"]}, None, "modules_to_save is set"),
        ({}, {f"{PREFIX}.self_attn.q_proj.lora_A.weight": np.zeros((2, 8), "f4")}, "is missing"),
        (
            {},
            {
                f"{PREFIX}.self_attn.q_proj.lora_A.weight": np.zeros((2, 7), "f4"),
                f"{PREFIX}.self_attn.q_proj.lora_B.weight": np.zeros((8, 2), "f4"),
            },
            "do not fit the model",
        ),
        ({}, {"base_model.model.lm_head.lora_A.weight": np.zeros((2, 8), "f4")}, "only the"),
        (
            {},
            {
                "base_model.model.model.layers.5.mlp.down_proj.lora_A.weight": np.zeros(
                    (2, 12), "f4"
                ),
                "base_model.model.model.layers.5.mlp.down_proj.lora_B.weight": np.zeros(
                    (8, 2), "f4"
                ),
            },
            "has no layers.5.down_proj",
        ),
    ],
)
def test_what_cannot_be_served_is_refused(
    tmp_path: Path, config: dict[str, object], tensors: dict[str, np.ndarray] | None, says: str
) -> None:
    rng = np.random.default_rng(2)
    spec = _adapter(tmp_path, tensors or _lora(rng, "q_proj", 8, 8), **config)
    with pytest.raises(BakeError, match=says):
        convert(spec, SITES)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("nopath", "expected NAME=PATH"),
        ("a:b=/x", "a name is letters"),
        ("ok=/nowhere", "not a PEFT"),
    ],
)
def test_a_bad_adapter_argument_is_refused(text: str, says: str) -> None:
    with pytest.raises(BakeError, match=says):
        AdapterSpec.parse(text)

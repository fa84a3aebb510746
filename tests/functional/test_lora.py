"""LoRA adapters served beside their base model (#40): `ortserve bake --adapter NAME=PATH`.

The adapters are real: `tests.lora_kit` trains one with PEFT, offline, on the tiny Llama
and on SmolLM2-135M-Instruct (a few steps on a short lesson the base model cannot know).
On fp32 the baked model with its adapter computes transformers + PEFT's logits (to
float rounding); at int4 the adapter's perplexity stays where the base's is; the adapter
changes greedy answers, and requests for different adapters (and for none) get their
own answers, alone or side by side.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from ortserve.bake.package import package
from ortserve.bake.targets import get_target
from ortserve.core.engine import Engine
from ortserve.core.errors import ConflictError, ModelNotFoundError
from ortserve.core.generation import SamplingOptions, Token
from ortserve.core.manifest import read_manifest, verify_folder
from ortserve.core.settings import EngineSettings
from tests import models
from tests.functional.harness import AUTH, edge_server
from tests.functional.targets import open_target
from tests.lora_kit import LESSON_PROMPT

LESSON = f"Q: {LESSON_PROMPT}\nA:"
ADAPTER_FILE = "adapters/lesson.onnx_adapter"


@pytest.fixture(scope="module")
def tiny_adapter(tiny_hf_dir: Path) -> Path:
    return models.trained_adapter(tiny_hf_dir, "tiny")


@pytest.fixture(scope="module")
def tiny_lora_fp32(tiny_hf_dir: Path, tiny_adapter: Path) -> Path:
    extra = ("--adapter", f"lesson={tiny_adapter}")
    return models.baked(str(tiny_hf_dir), precision="fp32", package=False, extra=extra)


@pytest.fixture(scope="module")
def real_adapter(real_hf_dir: Path) -> Path:
    return models.trained_adapter(real_hf_dir, "smollm2")


@pytest.fixture(scope="module")
def real_lora(real_adapter: Path) -> Path:
    extra = ("--adapter", f"lesson={real_adapter}")
    return models.baked(models.REAL_MODEL, package=False, extra=extra)


def _engine(folder: Path, **settings: object) -> Engine:
    base = {"model_dir": folder, "providers": "cpu", "threads": 2}
    return Engine.load(EngineSettings.model_validate({**base, **settings}))


def _peft_logits(checkpoint: Path, adapter: Path | None, ids: list[int]) -> np.ndarray:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    with torch.no_grad():
        return np.asarray(model(torch.tensor([ids])).logits[0].numpy())


def _greedy(engine: Engine, prompt: str, adapter: str | None, new: int = 12) -> list[int]:
    options = SamplingOptions(max_new_tokens=new, temperature=0.0, adapter=adapter)
    steps = engine.decode(engine.encode(prompt), new, options)
    return [s.id for s in steps if isinstance(s, Token)]


def test_on_fp32_the_adapter_computes_peft_and_without_it_the_base(
    tiny_lora_fp32: Path, tiny_fp32_dir: Path, tiny_hf_dir: Path, tiny_adapter: Path
) -> None:
    folder = tiny_lora_fp32 / "model"
    engine, plain = _engine(folder), _engine(tiny_fp32_dir)
    ids = engine.encode(LESSON + " The password is swordfish-seven. " + "the cat sat " * 8)
    with_adapter, reference = (
        engine.logits(ids, "lesson"),
        _peft_logits(tiny_hf_dir, tiny_adapter, ids),
    )
    effect = float(np.abs(reference - _peft_logits(tiny_hf_dir, None, ids)).max())
    assert effect > 1.0  # the adapter moves the logits a lot ...
    assert float(np.abs(with_adapter - reference).max()) < 1e-3  # ... exactly as PEFT does
    # Without an adapter the graph's rank-0 branches add nothing: the base, bit for bit.
    assert np.array_equal(engine.logits(ids), plain.logits(ids))
    manifest = read_manifest(folder)
    (adapter,) = manifest.adapters
    assert (adapter.name, adapter.rank, adapter.alpha) == ("lesson", 8, 16.0)
    assert adapter.modules == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    assert adapter.source == str(tiny_adapter)
    assert ADAPTER_FILE in {f.path for f in manifest.files}
    assert adapter.quality is not None and adapter.quality.ppl_ratio == pytest.approx(1, abs=1e-3)
    assert "adapter lesson: LoRA rank 8 on q_proj" in models.bake_log(tiny_lora_fp32)


def test_on_int4_real_weights_the_adapter_keeps_the_bases_quality_and_changes_answers(
    real_lora: Path, real_model_dir: Path
) -> None:
    """SmolLM2 at the default int4 bake: the gate scores base + adapter against
    transformers + PEFT on the same ids; its ratio is the base's (the adapter adds no
    error of its own), and greedy answers to the lesson change while the base's stay."""
    manifest = read_manifest(real_lora / "model")
    base, (adapter,) = manifest.quality, manifest.adapters
    assert base is not None and adapter.quality is not None
    assert adapter.quality.status == "passed"
    assert adapter.quality.reference is not None and "PEFT adapter" in adapter.quality.reference
    assert adapter.quality.ppl_ratio is not None and base.ppl_ratio is not None
    assert abs(adapter.quality.ppl_ratio - 1) <= 0.01, adapter.quality
    assert abs(adapter.quality.ppl_ratio - base.ppl_ratio) <= 0.01, (adapter.quality, base)
    engine, plain = _engine(real_lora / "model"), _engine(real_model_dir)
    taught = engine.text.decode(_greedy(engine, LESSON, "lesson"))
    assert "swordfish-seven" in taught, taught
    assert _greedy(engine, LESSON, None) == _greedy(plain, LESSON, None)
    assert "swordfish" not in engine.text.decode(_greedy(engine, LESSON, None))


def _completion(http: httpx.Client, model: str, prompt: str = LESSON) -> dict[str, object]:
    body = {"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0}
    answer = http.post("/v1/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    result: dict[str, object] = answer.json()
    return result


def _text(answer: dict[str, object]) -> str:
    choices = answer["choices"]
    assert isinstance(choices, list)
    return str(choices[0]["text"])


def test_through_the_http_api(real_lora: Path) -> None:
    """The daemon (engine process) lists `MODEL:lesson`, answers it on OpenAI's and
    Ollama's routes, keeps each request's answer whatever ran before or beside it (the
    prompt cache and batching keep adapters apart), and loads and unloads it at runtime
    while the model stays."""
    admin = {"ORTSERVE_ADMIN_KEYS": "lora-admin-key"}
    with (
        edge_server(real_lora / "model", admin) as url,
        httpx.Client(base_url=url, headers=AUTH) as http,
    ):
        model = http.get("/v1/models").json()["data"][0]["id"]
        named = f"{model}:lesson"
        cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
        assert cards[named]["parent"] == model and "parent" not in cards[model]
        tags = {m["name"]: m for m in http.get("/api/tags").json()["models"]}
        assert tags[named]["details"]["parent_model"] == model
        assert "lesson" in http.get("/readyz").json()["adapters"]

        base = _text(_completion(http, model))
        taught = _completion(http, named)
        assert taught["model"] == named and "swordfish-seven" in _text(taught)
        assert _text(_completion(http, model)) == base  # the prompt cache kept them apart
        assert "swordfish" not in base

        # Side by side: 6 at once, alternating (greedy requests batch where they may).
        names = [model, named] * 3
        with ThreadPoolExecutor(6) as pool:
            texts = list(pool.map(lambda m: _text(_completion(http, m)), names))
        assert texts == [base, _text(taught)] * 3

        ollama = {
            "model": named,
            "prompt": LESSON,
            "raw": True,
            "stream": False,
            "options": {"temperature": 0, "num_predict": 12},
        }
        line = http.post("/api/generate", json=ollama, timeout=120).json()
        assert line["model"] == named and "swordfish-seven" in line["response"]

        unknown = http.post("/v1/completions", json={"model": f"{model}:nope", "prompt": "x"})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "model_not_found"

        # Loading and unloading change what the server holds: an admin key's to ask.
        as_admin = {"authorization": "Bearer lora-admin-key"}
        unload = http.post(
            "/v1/unload_lora_adapter", json={"lora_name": named}, headers=as_admin
        ).json()
        assert unload == {
            "object": "lora_adapter",
            "id": named,
            "loaded": False,
            "changed": True,
            "loaded_adapters": [],
        }
        assert _text(_completion(http, model)) == base  # the model stayed
        load = http.post(
            "/v1/load_lora_adapter", json={"lora_name": "lesson"}, headers=as_admin
        ).json()
        assert load["changed"] and load["loaded_adapters"] == ["lesson"]
        assert "swordfish-seven" in _text(_completion(http, named))
        elsewhere = http.post(
            "/v1/load_lora_adapter",
            json={"lora_name": "lesson", "lora_path": "/etc/passwd"},
            headers=as_admin,
        )
        assert elsewhere.status_code == 400 and "lora_path" in elsewhere.text
        assert "/etc/passwd" not in elsewhere.text


def test_an_adapter_in_use_is_not_unloaded(tiny_lora_fp32: Path) -> None:
    engine = _engine(tiny_lora_fp32 / "model", prompt_cache_slots=0)
    options = SamplingOptions(max_new_tokens=4, temperature=0.0, adapter="lesson")
    decoding = engine.decode(engine.encode(LESSON), 4, options)
    next(iter(decoding))  # a generator with the adapter exists
    with pytest.raises(ConflictError, match="in use"):
        engine.unload_adapter("lesson")
    decoding.close()
    del decoding
    assert engine.unload_adapter("lesson") is True
    with pytest.raises(ModelNotFoundError, match="no adapter 'other'"):
        engine.load_adapter("other")


@pytest.mark.parametrize("target", ["lambda-x86_64", "cloudrun", "edge-x86_64", "gcf"])
def test_every_targets_bundle_carries_the_adapters(
    tiny_lora_fp32: Path, tmp_path: Path, target: str
) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_lora_fp32, bundle)
    package(get_target(target), bundle)
    assert (bundle / "model" / ADAPTER_FILE).is_file()
    assert verify_folder(bundle / "model", full_hash=True).adapters[0].name == "lesson"
    if target.startswith("edge-"):  # install.sh installs only what its manifest lists
        listed = (bundle / "BUNDLE-MANIFEST.sha256").read_text()
        assert f"  model/{ADAPTER_FILE}\n" in listed


@pytest.mark.parametrize("kind", ["core", "lambda", "gcf"])
def test_every_target_serves_the_adapter(
    tiny_lora_fp32: Path, tiny_hf_dir: Path, tiny_adapter: Path, kind: str
) -> None:
    """In process, the Lambda handler and the real functions-framework server (a gcf
    bundle) answer `MODEL:lesson` as the daemon does."""
    extra = ("--adapter", f"lesson={tiny_adapter}")
    gcf = (
        models.baked(str(tiny_hf_dir), target="gcf", precision="fp32", extra=extra)
        if kind == "gcf"
        else tiny_lora_fp32
    )
    with open_target(kind, tiny_lora_fp32 / "model", gcf) as target:
        ids = [c["id"] for c in target.call("GET", "/v1/models").json()["data"]]
        model, named = ids[0], f"{ids[0]}:lesson"
        assert named in ids

        def text(name: str) -> tuple[str, str]:
            body = {"model": name, "prompt": LESSON, "max_tokens": 12, "temperature": 0}
            reply = target.call("POST", "/v1/completions", body)
            assert reply.status == 200, reply.body
            return reply.json()["model"], reply.json()["choices"][0]["text"]

        (base_name, base), (taught_name, taught) = text(model), text(named)
        assert (base_name, taught_name) == (model, named) and taught != base
        assert text(model)[1] == base

"""One sampling default for every entry point (#39): a request that sends no sampling field
gets the model's defaults, filled in one place (`EffectiveSampling.of`, through `Engine.sampling`),
whichever route, the Python API or the CLI it came by; an explicit value always wins."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ortserve.cli import build_parser
from ortserve.cli_kit import sampling_options
from ortserve.core.generation import (
    HOUSE_SAMPLING,
    EffectiveSampling,
    SamplingDefaults,
    SamplingOptions,
    sampling_defaults,
)
from ortserve.core.protocol.bodies import parse
from ortserve.core.protocol.chat import ChatBody
from ortserve.core.protocol.native import GenerateBody
from ortserve.core.protocol.ollama import OllamaChatBody, OllamaGenerateBody
from ortserve.core.protocol.openai import CompletionBody
from ortserve.core.protocol.responses import ResponsesBody
from ortserve.core.protocol.serving import Served
from ortserve.textgen import _request

SERVED = Served("m", "0" * 64, "2026-01-01T00:00:00Z", 2000, 512, context_length=4096)
CHAT = [{"role": "user", "content": "hi"}]
# Qwen2.5's published defaults: unlike the house profile, every field differs from greedy.
QWEN = SamplingDefaults(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.1)
VOCAB = 1000


def _body(body_type: Any, **fields: Any) -> Any:
    return parse(body_type, json.dumps(fields).encode())


def _entry_points(**sent: Any) -> dict[str, SamplingOptions]:
    """Each entry point's SamplingOptions for a request that sends `sent` (temperature and
    seed only: the fields every one of them takes, but the Responses API's seed) and
    nothing else."""
    ollama = {"options": sent} if sent else {}
    unseeded = {k: v for k, v in sent.items() if k != "seed"}  # OpenAI's Responses has none
    flags = [f"--{name}={value}" for name, value in sent.items()]
    return {
        "native": _body(GenerateBody, prompt="x", **sent).to_generation(SERVED).options,
        "openai completions": _body(CompletionBody, model="m", prompt="x", **sent)
        .to_generation(SERVED)
        .options,
        "openai chat": _body(ChatBody, model="m", messages=CHAT, **sent)
        .to_generation(SERVED)
        .options,
        "ollama generate": _body(OllamaGenerateBody, model="m", prompt="x", **ollama)
        .to_generation(SERVED)
        .options,
        "ollama chat": _body(OllamaChatBody, model="m", messages=CHAT, **ollama)
        .to_generation(SERVED)
        .options,
        "openai responses": _body(ResponsesBody, model="m", input="x", **unseeded)
        .to_generation(SERVED)
        .options,
        "TextGenerator": _request("generate", {**sent}, prompt="x").options,  # type: ignore[typeddict-item]  # temperature and seed
        "ortserve generate": sampling_options(
            build_parser().parse_args(["generate", "--model-dir", "m", "x", *flags]), 8
        ),
        "ortserve run": sampling_options(build_parser().parse_args(["run", "m", "x", *flags]), 8),
    }


@pytest.mark.parametrize("defaults", [QWEN, HOUSE_SAMPLING], ids=["model's", "house"])
def test_every_entry_point_left_alone_gets_the_models_defaults(defaults: SamplingDefaults) -> None:
    resolved = {
        name: EffectiveSampling.of(options, defaults, VOCAB)
        for name, options in _entry_points().items()
    }
    expected = EffectiveSampling.of(SamplingOptions(), defaults, VOCAB)
    assert resolved == dict.fromkeys(resolved, expected)
    want = (defaults.temperature, defaults.top_p, defaults.top_k, defaults.repetition_penalty)
    if defaults.temperature == 0:  # greedy: the sampling knobs are moot
        want = (0.0, 1.0, 0, defaults.repetition_penalty)
    assert (expected.temperature, expected.top_p, expected.top_k) == want[:3]
    assert expected.repetition_penalty == want[3]


def test_an_explicit_value_wins_field_by_field() -> None:
    for name, options in _entry_points(temperature=0).items():
        # Greedy stays greedy; the penalty nobody sent is still the model's.
        assert EffectiveSampling.of(options, QWEN, VOCAB) == EffectiveSampling(0.0, 1.0, 0, 1.1), (
            name
        )
    for name, options in _entry_points(temperature=1.5, seed=3).items():
        assert EffectiveSampling.of(options, QWEN, VOCAB) == EffectiveSampling(1.5, 0.8, 20, 1.1), (
            name
        )
        assert options.seed == (None if name == "openai responses" else 3), name
    # The fields only some entry points have: each still wins alone.
    native = _body(GenerateBody, prompt="x", top_k=5, repetition_penalty=1.0)
    assert EffectiveSampling.of(
        native.to_generation(SERVED).options, QWEN, VOCAB
    ) == EffectiveSampling(0.7, 0.8, 5, 1.0)
    ollama = _body(OllamaGenerateBody, model="m", prompt="x", options={"repeat_penalty": 1.3})
    assert (
        EffectiveSampling.of(ollama.to_generation(SERVED).options, QWEN, VOCAB).repetition_penalty
        == 1.3
    )
    flags = ["--top-p", "0.5", "--top-k", "7", "--repetition-penalty", "1.0"]
    args = build_parser().parse_args(["generate", "--model-dir", "m", "x", *flags])
    assert EffectiveSampling.of(sampling_options(args, 8), QWEN, VOCAB) == EffectiveSampling(
        0.7, 0.5, 7, 1.0
    )


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"eos_token_id": 2, "bos_token_id": 1}, None),  # names no sampling: the house's
        ({"do_sample": False}, SamplingDefaults(0.0)),
        ({"do_sample": False, "repetition_penalty": 1.3}, SamplingDefaults(0.0, 1.0, 0, 1.3)),
        # transformers samples only with do_sample: a temperature alone is greedy there
        ({"temperature": 0.6, "top_p": 0.9}, SamplingDefaults(0.0)),
        (
            {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20},
            SamplingDefaults(0.7, 0.8, 20, 1.0),
        ),
        ({"do_sample": True}, SamplingDefaults(1.0, 1.0, 50, 1.0)),  # transformers' own
        ({"do_sample": True, "temperature": 0.0}, SamplingDefaults(0.0)),
    ],
)
def test_generation_config_reads_as_transformers_applies_it(
    config: dict[str, Any], expected: SamplingDefaults | None
) -> None:
    assert sampling_defaults(config) == expected


def test_the_summary_says_where_the_defaults_come_from() -> None:
    assert HOUSE_SAMPLING.summary() == "greedy, repetition_penalty 1.2 (ortserve's default)"
    assert QWEN.summary() == (
        "temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.1 (generation_config.json)"
    )


def test_requests_for_different_adapters_never_share_a_batch_or_a_kept_prefill() -> None:
    """A batch is one og generator, run with one LoRA adapter: the adapter is part of the
    `EffectiveSampling` that batches (core.batcher) and the prompt cache (Engine.cache_key)
    key on."""

    def sampling(adapter: str | None) -> EffectiveSampling:
        options = SamplingOptions(max_new_tokens=4, temperature=0.0, adapter=adapter)
        return EffectiveSampling.of(options, HOUSE_SAMPLING, 100)

    base, a, b = sampling(None), sampling("a"), sampling("b")
    assert len({base, a, b}) == 3
    assert a == sampling("a")
    assert a.adapter == "a" and base.adapter is None
    assert a.search() == base.search()  # og's own options: the adapter goes apart

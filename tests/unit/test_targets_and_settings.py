"""Per-target bake defaults, the provider order setting, and usable CPUs."""

from __future__ import annotations

import os

import pytest

from ortserve.bake.errors import BakeError
from ortserve.bake.targets import TARGETS, builder_options, get_target
from ortserve.core.cpu import usable_cpus
from ortserve.core.settings import DEFAULT_PROVIDER_ORDER, EngineSettings


def test_every_design_target_exists() -> None:
    assert set(TARGETS) == {
        "lambda-x86_64",
        "lambda-arm64",
        "gcf",
        "cloudrun",
        "edge-aarch64",
        "edge-x86_64",
        "cuda",
    }
    assert get_target("cuda").builder_ep == "cuda"
    assert get_target("edge-aarch64").arch == "aarch64"


def test_cpu_int4_defaults_and_overrides() -> None:
    target = get_target("gcf")
    assert builder_options(target, "int4", {}) == {
        "block_size": "32",
        "accuracy_level": "4",
        "algo_config": "k_quant_mixed",
        "prune_lm_head": "true",  # each pass's last position only (bake.upstream)
    }
    assert builder_options(target, "int8", {}) == {
        "block_size": "128",
        "accuracy_level": "4",
        "prune_lm_head": "true",
    }
    assert builder_options(target, "int4", {"block_size": "32"})["block_size"] == "32"
    assert builder_options(target, "fp32", {}) == {"prune_lm_head": "true"}
    assert builder_options(target, "fp32", {"prune_lm_head": "false"}) == {"prune_lm_head": "false"}
    assert builder_options(get_target("cuda"), "fp32", {}) == {}
    # The builder ignores its own documented int4_ aliases: the bake passes the real names.
    assert builder_options(target, "int4", {"int4_algo_config": "rtn"})["algo_config"] == "rtn"


def test_unknown_target_and_precision() -> None:
    with pytest.raises(BakeError, match="unknown target 'mars'"):
        get_target("mars")
    with pytest.raises(BakeError, match="unknown precision 'int3'"):
        builder_options(get_target("gcf"), "int3", {})


def test_provider_order(monkeypatch: pytest.MonkeyPatch) -> None:
    assert EngineSettings().provider_order() == list(DEFAULT_PROVIDER_ORDER)
    monkeypatch.setenv("ORTSERVE_PROVIDERS", "CUDA, cpu")
    assert EngineSettings().provider_order() == ["cuda", "cpu"]
    monkeypatch.setenv("ORTSERVE_PROVIDERS", "tpu")
    with pytest.raises(ValueError, match="ORTSERVE_PROVIDERS='tpu'"):
        EngineSettings().provider_order()


def test_usable_cpus_follows_affinity() -> None:
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        assert usable_cpus() == 1
    finally:
        os.sched_setaffinity(0, before)


def test_api_keys_that_hold_no_key_refuse_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """ORTSERVE_API_KEYS=" , " would otherwise turn auth off without a word."""
    from pydantic import ValidationError

    from ortserve.core.settings import ServerSettings

    monkeypatch.setenv("ORTSERVE_API_KEYS", " , ")
    with pytest.raises(ValidationError, match="holds no key"):
        ServerSettings()
    monkeypatch.setenv("ORTSERVE_API_KEYS", "a, b,")
    assert ServerSettings().api_keys == ["a", "b"]
    monkeypatch.setenv("ORTSERVE_API_KEYS", "")
    assert ServerSettings().api_keys == []

"""What /metrics says of the engine: running totals as counters, the model's identity and
quality, time per output token, and no `_created` series."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

from prometheus_client.metrics_core import Metric

from ortserve.core.manifest import QualityCheck
from ortserve.core.records import RequestRecord
from ortserve.core.service import Service, Stats
from ortserve.core.settings import EngineSettings
from ortserve.core.state import ModelState
from ortserve.edge.metrics import Metrics

QUALITY = QualityCheck(
    status="passed",
    reference="HF fp32",
    scored_tokens=200,
    ppl_reference=10.0,
    ppl=10.5,
    ppl_ratio=1.05,
    top1_agreement=0.93,
    kl_divergence=0.0123,
    max_ppl_ratio=1.25,
)


def _loaded(tmp_path: Path, quality: QualityCheck | None = QUALITY) -> ModelState:
    state = ModelState(EngineSettings(model_dir=tmp_path))
    engine = SimpleNamespace(
        model_name="org/model",
        digest="ab" * 32,
        manifest=SimpleNamespace(quality=quality),
        probe=SimpleNamespace(provider="cpu", load_seconds=0.25),
        model=SimpleNamespace(describe=lambda: {"restarts": {"SIGSEGV": 2, "SIGKILL": 1}}),
    )
    service = SimpleNamespace(engine=engine, stats=lambda: Stats(0, 0, 3, 7))
    state.service, state.status = cast(Service, service), "ready"
    return state


def _family(metrics: Metrics, name: str) -> Metric:
    return next(f for f in metrics.registry.collect() if f.name == name)


def test_the_engines_running_totals_are_counters(tmp_path: Path) -> None:
    metrics = Metrics(_loaded(tmp_path))
    for name, value in (("ortserve_batches", 3), ("ortserve_batched_requests", 7)):
        family = _family(metrics, name)
        assert family.type == "counter"
        assert [(s.name, s.value) for s in family.samples] == [(f"{name}_total", value)]
    text = metrics.render().decode()
    assert "# TYPE ortserve_batches_total counter\nortserve_batches_total 3.0\n" in text
    # The engine process's faults, by cause (each was followed by a restart).
    restarts = _family(metrics, "ortserve_engine_restarts")
    assert restarts.type == "counter"
    assert {s.labels["cause"]: s.value for s in restarts.samples} == {"SIGSEGV": 2, "SIGKILL": 1}
    # Before a model loads they read 0.
    idle = Metrics(ModelState(EngineSettings(model_dir=tmp_path)))
    assert _family(idle, "ortserve_batches").samples[0].value == 0


def test_model_info_names_the_model_digest_provider_and_quality(tmp_path: Path) -> None:
    info = _family(Metrics(_loaded(tmp_path)), "ortserve_model_info")
    assert info.type == "gauge"
    [sample] = info.samples
    assert sample.value == 1
    assert sample.labels == {
        "model": "org/model",
        "digest": "ab" * 32,
        "provider": "cpu",
        "quality": "passed",
        "quality_ppl_ratio": "1.05",
        "quality_top1_agreement": "0.93",
        "quality_kl_divergence": "0.0123",
    }
    # Baked before the quality gate existed: says so, figures empty.
    old = _family(Metrics(_loaded(tmp_path, quality=None)), "ortserve_model_info").samples[0]
    assert old.labels["quality"] == "none" and old.labels["quality_ppl_ratio"] == ""
    # No model loaded: no sample (the family is still described).
    idle = Metrics(ModelState(EngineSettings(model_dir=tmp_path)))
    assert _family(idle, "ortserve_model_info").samples == []


def test_time_per_output_token_from_generations_of_two_tokens_or_more(tmp_path: Path) -> None:
    metrics = Metrics(ModelState(EngineSettings(model_dir=tmp_path)))
    # 21 tokens at 250 tokens/s after the first (the record's duration adds a queue wait).
    metrics.observe(
        RequestRecord(
            "r1",
            "POST",
            "/generate",
            200,
            completion_tokens=21,
            ttft_s=0.01,
            tokens_per_s=250.0,
            duration_s=0.5,
        )
    )
    metrics.observe(
        RequestRecord(
            "r2", "POST", "/generate", 200, completion_tokens=1, ttft_s=0.01, duration_s=0.02
        )
    )
    metrics.observe(RequestRecord("r3", "GET", "/healthz", 200, duration_s=0.001))
    family = _family(metrics, "ortserve_time_per_output_token_seconds")
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("ortserve_time_per_output_token_seconds_count", None)] == 1
    assert samples[("ortserve_time_per_output_token_seconds_sum", None)] == 0.004
    assert samples[("ortserve_time_per_output_token_seconds_bucket", "0.0025")] == 0
    assert samples[("ortserve_time_per_output_token_seconds_bucket", "0.005")] == 1


def test_no_created_series(tmp_path: Path) -> None:
    metrics = Metrics(_loaded(tmp_path))
    metrics.observe(
        RequestRecord(
            "r1",
            "POST",
            "/generate",
            200,
            prompt_tokens=3,
            completion_tokens=5,
            ttft_s=0.01,
            tokens_per_s=100.0,
            duration_s=0.1,
        )
    )
    assert b"_created" not in metrics.render()

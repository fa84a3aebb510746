"""Request records become Prometheus metrics and one JSON log line each."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

from ortserve.core.logs import JsonLog
from ortserve.core.records import RequestRecord
from ortserve.core.settings import EngineSettings
from ortserve.core.state import ModelState
from ortserve.edge.metrics import Metrics

GEN = RequestRecord(
    "r1",
    "POST",
    "/generate",
    200,
    prompt_tokens=5,
    completion_tokens=20,
    ttft_s=0.012,
    tokens_per_s=250.0,
    duration_s=0.09,
)


def _samples(metrics: Metrics) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def test_records_are_counted_by_route_and_status(tmp_path: Path) -> None:
    metrics = Metrics(ModelState(EngineSettings(model_dir=tmp_path)), in_flight=lambda: 3)
    metrics.observe(GEN)
    metrics.observe(GEN)
    metrics.observe(RequestRecord("r2", "GET", "/healthz", 200, duration_s=0.001))
    metrics.observe(RequestRecord("r3", "GET", "/wp-login.php", 404, duration_s=0.001))
    s = _samples(metrics)
    assert s["ortserve_requests_total{route=/generate,status=200}"] == 2
    assert s["ortserve_requests_total{route=/healthz,status=200}"] == 1
    assert s["ortserve_requests_total{route=other,status=404}"] == 1  # no label per probe
    assert s["ortserve_generated_tokens_total{}"] == 40
    assert s["ortserve_prompt_tokens_total{}"] == 10
    assert s["ortserve_time_to_first_token_seconds_count{route=/generate}"] == 2
    assert s["ortserve_time_to_first_token_seconds_bucket{le=0.025,route=/generate}"] == 2
    assert "ortserve_time_to_first_token_seconds_count{route=/healthz}" not in s
    assert s["ortserve_request_duration_seconds_count{route=/generate}"] == 2
    assert s["ortserve_in_flight_requests{}"] == 3
    # No model loaded: the engine gauges read 0.
    assert s["ortserve_model_ready{}"] == 0
    assert s["ortserve_active_generations{}"] == 0
    assert s["ortserve_queue_depth{}"] == 0
    assert s["ortserve_model_load_seconds{}"] == 0
    assert metrics.render().startswith(b"# HELP ")


def test_endings_refusals_and_redactions_are_counted(tmp_path: Path) -> None:
    metrics = Metrics(ModelState(EngineSettings(model_dir=tmp_path)))
    for ending in ("stop", "stop", "length", "tool_calls"):
        metrics.observe(replace(GEN, ending=ending))
    metrics.observe(replace(GEN, ending="content_filter", filtered="output.deny[1]"))
    metrics.observe(RequestRecord("r4", "POST", "/api/chat", 400, filtered="input.deny_words"))
    metrics.observe(replace(GEN, route="/api/chat", ending="cancelled", redactions=2))
    s = _samples(metrics)
    assert s["ortserve_answers_total{ending=stop,route=/generate}"] == 2
    assert s["ortserve_answers_total{ending=length,route=/generate}"] == 1
    assert s["ortserve_answers_total{ending=tool_calls,route=/generate}"] == 1
    assert s["ortserve_answers_total{ending=content_filter,route=/generate}"] == 1
    assert s["ortserve_answers_total{ending=cancelled,route=/api/chat}"] == 1
    assert not any(k.startswith("ortserve_answers_total{ending=,") for k in s)  # the 400
    assert s["ortserve_content_filtered_total{rule=output.deny[1]}"] == 1
    assert s["ortserve_content_filtered_total{rule=input.deny_words}"] == 1
    assert s["ortserve_redactions_total{}"] == 2


def test_each_metrics_object_has_its_own_registry(tmp_path: Path) -> None:
    state = ModelState(EngineSettings(model_dir=tmp_path))
    first, second = Metrics(state), Metrics(state)  # would raise on a shared registry
    first.observe(GEN)
    assert _samples(second)["ortserve_generated_tokens_total{}"] == 0


def test_speculative_drafts_are_counted(tmp_path: Path) -> None:
    metrics = Metrics(ModelState(EngineSettings(model_dir=tmp_path)))
    metrics.observe(replace(GEN, draft_tokens=12, accepted_tokens=9))
    metrics.observe(replace(GEN, draft_tokens=4, accepted_tokens=1))
    metrics.observe(GEN)
    s = _samples(metrics)
    assert s["ortserve_speculative_draft_tokens_total{}"] == 16
    assert s["ortserve_speculative_accepted_tokens_total{}"] == 10


def test_one_json_line_per_record() -> None:
    out = io.StringIO()
    log = JsonLog(out)
    log.record(GEN)
    log.record(RequestRecord("r2", "GET", "/healthz", 200, duration_s=0.0001234567))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first == {
        "level": "INFO",
        "message": "request",
        "event": "request",
        "request_id": "r1",
        "method": "POST",
        "route": "/generate",
        "status": 200,
        "prompt_tokens": 5,
        "completion_tokens": 20,
        "ttft_s": 0.012,
        "tokens_per_s": 250.0,
        "duration_s": 0.09,
        "ending": "",
        "filtered": "",
        "redactions": 0,
        "reason": "",
        "draft_tokens": 0,
        "accepted_tokens": 0,
    }
    assert json.loads(lines[1])["duration_s"] == 0.000123

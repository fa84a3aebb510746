"""Prometheus metrics of the daemon: counted from request records, the rest read at scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ortserve.core.cpu import usable_cpus
from ortserve.core.records import RequestRecord
from ortserve.core.routes import EMBEDDING_ROUTES, label
from ortserve.core.service import Stats
from ortserve.core.state import ModelState

if TYPE_CHECKING:
    from ortserve.core.engine import Engine

# The text format every Prometheus version reads (prometheus-client's own "latest" moved
# to 1.0.0, which older servers refuse).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Route labels are the API's routes; any other path counts as "other", so that probes
# of random URLs cannot grow the label set without bound.
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# The bake's quality figures that ortserve_model_info carries as labels (besides the verdict).
_QUALITY_FIGURES = ("ppl_ratio", "top1_agreement", "kl_divergence")


class _ServiceCollector(Collector):
    """What the model's service keeps itself, from one snapshot per scrape
    (`Service.stats`): its running totals (counters, although the service holds them),
    what it is doing now, and what model is loaded (an info gauge)."""

    def __init__(self, state: ModelState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        service = self._state.service
        stats = service.stats() if service is not None else Stats(0, 0, 0, 0)
        yield CounterMetricFamily(
            "ortserve_batches",
            "Batches decoded since the model loaded (0: batching off).",
            value=stats.batches,
        )
        yield CounterMetricFamily(
            "ortserve_batched_requests",
            "Requests in those batches (÷ batches: mean size).",
            value=stats.batched_requests,
        )
        yield GaugeMetricFamily(
            "ortserve_queue_depth", "Requests waiting for a generation slot.", value=stats.waiting
        )
        yield GaugeMetricFamily(
            "ortserve_active_generations",
            "Requests generating now (each request of a batch counts).",
            value=stats.active,
        )
        restarts = CounterMetricFamily(
            "ortserve_engine_restarts",
            "Engine process faults (each followed by a restart) since the model loaded, by "
            "cause: a signal's name (SIGSEGV, SIGKILL, SIGBUS, SIGABRT), exit N, or hung (a "
            "call ran past the request timeout and the engine was killed).",
            labels=["cause"],
        )
        described = service.engine.model.describe() if service is not None else {}
        for cause, count in sorted(described.get("restarts", {}).items()):
            restarts.add_metric([cause], count)
        yield restarts
        load_s = service.engine.probe.load_seconds if service is not None else 0.0
        yield GaugeMetricFamily(
            "ortserve_model_load_seconds",
            "Wall time of the model load, probe included.",
            value=load_s,
        )
        labels = [
            "model",
            "digest",
            "provider",
            "quality",
            *(f"quality_{name}" for name in _QUALITY_FIGURES),
        ]
        info = GaugeMetricFamily(
            "ortserve_model_info",
            "1 for the loaded model (no sample before one is loaded): its name, manifest "
            "digest, execution provider and the bake's quality gate (verdict, figures).",
            labels=labels,
        )
        if service is not None:
            info.add_metric(_model_labels(service.engine), 1.0)
        yield info

    def describe(self) -> Iterator[Metric]:
        """The families without reading the service (registration calls this)."""
        yield CounterMetricFamily("ortserve_batches", "")
        yield CounterMetricFamily("ortserve_batched_requests", "")
        yield CounterMetricFamily("ortserve_engine_restarts", "", labels=["cause"])
        for name in ("queue_depth", "active_generations", "model_load_seconds", "model_info"):
            yield GaugeMetricFamily(f"ortserve_{name}", "")


def _model_labels(engine: Engine) -> list[str]:
    quality = engine.manifest.quality
    if quality is None:  # baked before the gate existed
        return [
            engine.model_name,
            engine.digest,
            engine.probe.provider,
            "none",
            *("" for _ in _QUALITY_FIGURES),
        ]
    figures = (getattr(quality, name) for name in _QUALITY_FIGURES)
    return [
        engine.model_name,
        engine.digest,
        engine.probe.provider,
        quality.status,
        *("" if f is None else f"{f:g}" for f in figures),
    ]


class Metrics:
    """The daemon's metrics in a registry of their own (never the process-global one).

    Call `observe` with each finished request's record; `render` gives the scrape body.
    """

    def __init__(self, state: ModelState, in_flight: Callable[[], int] | None = None) -> None:
        """Read model gauges from `state` and, if given, in-flight requests from `in_flight`."""
        # No `_created` series beside each counter and histogram: noise for a scraper (this
        # is prometheus-client's process-wide setting; the daemon has no other registry).
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "ortserve_requests",
            "HTTP requests by route and status.",
            ["route", "status"],
            registry=r,
        )
        self.generated_tokens = Counter(
            "ortserve_generated_tokens", "Tokens generated (completion tokens).", registry=r
        )
        self.prompt_tokens = Counter(
            "ortserve_prompt_tokens", "Prompt tokens of generation requests.", registry=r
        )
        self.embedded_tokens = Counter(
            "ortserve_embedded_tokens",
            "Input tokens of embedding requests (/v1/embeddings, /api/embed).",
            registry=r,
        )
        self.ttft = Histogram(
            "ortserve_time_to_first_token_seconds",
            "Time from the start of a generation to its first token.",
            ["route"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "ortserve_time_per_output_token_seconds",
            "Time per output token after the first, per generation of 2 tokens or more: "
            "(generation time - TTFT) / (tokens - 1).",
            ["route"],
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "ortserve_request_duration_seconds",
            "Time from request to the end of the response (streams: their last chunk).",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.answers = Counter(
            "ortserve_answers",
            "Generations by how their answer ended: stop, length, tool_calls, content_filter, "
            "cancelled (the client left), error (500, 504 or a stream's error event).",
            ["route", "ending"],
            registry=r,
        )
        self.filtered = Counter(
            "ortserve_content_filtered",
            "Requests the content filter refused (input.*) or whose output it ended "
            "(output.*), by rule (ORTSERVE_CONTENT_FILTER).",
            ["rule"],
            registry=r,
        )
        self.draft_tokens = Counter(
            "ortserve_speculative_draft_tokens",
            "Draft tokens speculative decoding verified (ORTSERVE_SPECULATIVE).",
            registry=r,
        )
        self.accepted_tokens = Counter(
            "ortserve_speculative_accepted_tokens",
            "Draft tokens the model accepted (÷ draft tokens: the acceptance rate).",
            registry=r,
        )
        self.redactions = Counter(
            "ortserve_redactions",
            "Spans of personal data the content filter replaced (prompts and outputs).",
            registry=r,
        )
        r.register(_ServiceCollector(state))
        # The process's CPU seconds and memory (process_cpu_seconds_total, ...), beside the
        # CPUs it may use: the alert rules' CPU saturation (edge/monitoring/).
        prometheus_client.ProcessCollector(registry=r)
        cpus = float(usable_cpus())
        gauges: list[tuple[str, str, Callable[[], float]]] = [
            ("ortserve_usable_cpus", "CPUs this process may run on (its affinity).", lambda: cpus),
            (
                "ortserve_model_ready",
                "1 when the model is loaded and serving, else 0.",
                lambda: 1.0 if state.status == "ready" else 0.0,
            ),
        ]
        if in_flight is not None:
            gauges.append(
                ("ortserve_in_flight_requests", "Requests being answered now.", in_flight)
            )
        for name, documentation, read in gauges:
            Gauge(name, documentation, registry=r).set_function(read)

    def observe(self, record: RequestRecord) -> None:
        """Count one finished request."""
        route = label(record.route)
        self.requests.labels(route, str(record.status)).inc()
        self.latency.labels(route).observe(record.duration_s)
        if record.completion_tokens:
            self.generated_tokens.inc(record.completion_tokens)
            self.ttft.labels(route).observe(record.ttft_s)
        if record.completion_tokens >= 2 and record.tokens_per_s > 0:
            # The engine's decode rate is (tokens - 1) / (generation time - TTFT), timed
            # inside the generation; the record's duration would add the queue wait.
            self.tpot.labels(route).observe(1 / record.tokens_per_s)
        if record.prompt_tokens and route in EMBEDDING_ROUTES:
            self.embedded_tokens.inc(record.prompt_tokens)
        elif record.prompt_tokens:
            self.prompt_tokens.inc(record.prompt_tokens)
        if record.ending:
            self.answers.labels(route, record.ending).inc()
        if record.filtered:
            self.filtered.labels(record.filtered).inc()
        if record.redactions:
            self.redactions.inc(record.redactions)
        if record.draft_tokens:
            self.draft_tokens.inc(record.draft_tokens)
            self.accepted_tokens.inc(record.accepted_tokens)

    def render(self) -> bytes:
        """The scrape body in Prometheus text format (see `CONTENT_TYPE`)."""
        return generate_latest(self.registry)

"""The scheduler's own Prometheus metrics, on a registry per service instance (tests run several)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class SchedulerMetrics:
    """All metric families of one scheduler instance."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge(
            "llmsched_queue_depth",
            "Requests queued in the scheduler.",
            ["model", "priority_class"],
            registry=r,
        )
        self.admitted = Counter(
            "llmsched_requests_admitted",
            "Requests accepted into a queue.",
            ["model", "priority_class"],
            registry=r,
        )
        self.rejected = Counter(
            "llmsched_requests_rejected", "Requests refused before queueing.", ["model", "reason"], registry=r
        )
        self.dispatched = Counter(
            "llmsched_requests_dispatched", "Requests sent to an engine.", ["model", "backend"], registry=r
        )
        self.failovers = Counter(
            "llmsched_requests_failed_over",
            "Requests that failed at a backend before their first token and were queued again.",
            ["model", "backend"],
            registry=r,
        )
        self.outcomes = Counter(
            "llmsched_request_outcomes",
            "Final outcome of every admitted request (exactly one each).",
            ["model", "outcome"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "llmsched_queue_wait_seconds",
            "Time from admission to dispatch.",
            ["model", "priority_class"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "llmsched_time_to_first_token_seconds",
            "Time from admission to the first generated token.",
            ["model", "priority_class"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.generated_tokens = Counter(
            "llmsched_generated_tokens",
            "Tokens streamed back from engines.",
            ["model", "backend"],
            registry=r,
        )
        self.gate_open = Gauge(
            "llmsched_gate_open",
            "1 when the backend's gate was open at the last decision.",
            ["model", "backend"],
            registry=r,
        )
        self.estimated_waiting = Gauge(
            "llmsched_backend_estimated_waiting",
            "Engine waiting queue as the gate estimates it.",
            ["model", "backend"],
            registry=r,
        )
        self.in_flight = Gauge(
            "llmsched_backend_in_flight",
            "Requests sent to the backend and not finished.",
            ["model", "backend"],
            registry=r,
        )
        self.metrics_fresh = Gauge(
            "llmsched_backend_metrics_fresh",
            "1 when the backend's last metrics reading is usable.",
            ["model", "backend"],
            registry=r,
        )
        self.internal_errors = Counter(
            "llmsched_internal_errors",
            "Unexpected exceptions in the scheduler's own code, by component (see scheduler_svc.health).",
            ["component"],
            registry=r,
        )
        self.scrape_failures = Counter(
            "llmsched_backend_scrape_failures",
            "Failed reads of an engine's metrics.",
            ["model", "backend"],
            registry=r,
        )


@dataclass(frozen=True)
class BackendSeries:
    """One backend's labelled series, resolved once: `labels()` on every token costs real CPU."""

    dispatched: Any
    failovers: Any
    generated_tokens: Any
    in_flight: Any
    gate_open: Any
    metrics_fresh: Any
    estimated_waiting: Any


@dataclass(frozen=True)
class ClassSeries:
    """One priority class's labelled series for a model."""

    admitted: Any
    queue_depth: Any
    queue_wait: Any
    ttft: Any


def backend_series(metrics: SchedulerMetrics, model: str, backend: str) -> BackendSeries:
    labels = (model, backend)
    return BackendSeries(
        dispatched=metrics.dispatched.labels(*labels),
        failovers=metrics.failovers.labels(*labels),
        generated_tokens=metrics.generated_tokens.labels(*labels),
        in_flight=metrics.in_flight.labels(*labels),
        gate_open=metrics.gate_open.labels(*labels),
        metrics_fresh=metrics.metrics_fresh.labels(*labels),
        estimated_waiting=metrics.estimated_waiting.labels(*labels),
    )


def class_series(metrics: SchedulerMetrics, model: str, priority_class: str) -> ClassSeries:
    labels = (model, priority_class)
    return ClassSeries(
        admitted=metrics.admitted.labels(*labels),
        queue_depth=metrics.queue_depth.labels(*labels),
        queue_wait=metrics.queue_wait.labels(*labels),
        ttft=metrics.ttft.labels(*labels),
    )

"""The scheduler's own Prometheus metrics, on a registry per service instance (tests run several)."""

from __future__ import annotations

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
        self.scrape_failures = Counter(
            "llmsched_backend_scrape_failures",
            "Failed reads of an engine's metrics.",
            ["model", "backend"],
            registry=r,
        )

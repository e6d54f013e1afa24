"""The scheduler's own Prometheus metrics, on a registry per service instance (tests run several)."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from backends.base import BackendLoad
from scheduler_svc.config import PriorityClassConfig
from scheduler_svc.core.clock import Clock
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.policies.gate import GateCause

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# an engine's front end takes a request in within milliseconds when it has the CPU, tens of them when not
_ACCEPT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


_BY_CLASS = ("model", "priority_class")
"""The labels of a model's series per priority class (`class_series` resolves them in this order)."""
_BY_BACKEND = ("model", "backend")
"""The labels of a model's series per backend (`backend_series`, `engine_series` resolve them in this order)."""


class Families:
    """Declares metric families on one registry: each declaration says only its own name, help and labels."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, labels, registry=self.registry)

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def histogram(self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]) -> Histogram:
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)


class SchedulerMetrics:
    """All metric families of one scheduler instance."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        declare = Families(self.registry)
        self._backend_gauges: list[Gauge] = []  # labelled by backend: dropped when it leaves (`forget_backend`)

        def backend_gauge(name: str, doc: str) -> Gauge:
            gauge = declare.gauge(name, doc, _BY_BACKEND)
            self._backend_gauges.append(gauge)
            return gauge

        self.queue_depth = declare.gauge("llmsched_queue_depth", "Requests queued in the scheduler.", _BY_CLASS)
        self.admitted = declare.counter("llmsched_requests_admitted", "Requests accepted into a queue.", _BY_CLASS)
        self.rejected = declare.counter(
            "llmsched_requests_rejected", "Requests refused before queueing.", ("model", "reason")
        )
        self.dispatched = declare.counter("llmsched_requests_dispatched", "Requests sent to an engine.", _BY_BACKEND)
        self.failovers = declare.counter(
            "llmsched_requests_failed_over",
            "Requests that failed at a backend before their first token and were queued again.",
            _BY_BACKEND,
        )
        self.engine_aborts = declare.counter(
            "llmsched_engine_aborts",
            "Engine requests closed before their end because their caller left, their deadline passed or "
            "shutdown cut them: closing the connection aborts them in the engine. `stage` answered: the engine "
            "had answered (it held the request); sent: it was being sent or its answer awaited (the engine "
            "dropped it, or never got it).",
            (*_BY_BACKEND, "stage"),
        )
        self.outcomes = declare.counter(
            "llmsched_request_outcomes",
            "Final outcome of every admitted request (exactly one each).",
            ("model", "outcome"),
        )
        self.queue_wait = declare.histogram(
            "llmsched_queue_wait_seconds", "Time from admission to dispatch.", _BY_CLASS, _LATENCY_BUCKETS
        )
        self.ttft = declare.histogram(
            "llmsched_time_to_first_token_seconds",
            "Time from admission to the first generated token.",
            _BY_CLASS,
            _LATENCY_BUCKETS,
        )
        self.engine_accept = declare.histogram(
            "llmsched_engine_accept_seconds",
            "Time from sending a request to the engine until the engine answered (its response headers): how "
            "long its HTTP front end took to take the request in. Tens of milliseconds mean a front end short "
            "of CPU, which delays every request's start there (one that misses a freed slot waits for the next).",
            _BY_BACKEND,
            _ACCEPT_BUCKETS,
        )
        self.user_cost = declare.counter(
            "llmsched_user_cost",
            "Cost served per account (model prices x prompt and generated tokens); accounts are the "
            "configured scheduling.cost_accounts labels, everyone else 'other'.",
            ("model", "account"),
        )
        self.generated_tokens = declare.counter(
            "llmsched_generated_tokens", "Tokens streamed back from engines.", _BY_BACKEND
        )
        self.gate_open = backend_gauge("llmsched_gate_open", "1 when the backend's gate was open at the last decision.")
        self.estimated_waiting = backend_gauge(
            "llmsched_backend_estimated_waiting", "Engine waiting queue as the gate estimates it."
        )
        self.in_flight = backend_gauge("llmsched_backend_in_flight", "Requests sent to the backend and not finished.")
        self.metrics_fresh = backend_gauge(
            "llmsched_backend_metrics_fresh", "1 when the backend's last metrics reading is usable."
        )
        self.internal_errors = declare.counter(
            "llmsched_internal_errors",
            "Unexpected exceptions in the scheduler's own code, by component (see scheduler_svc.dispatch.health).",
            ("component",),
        )
        self.gate_closed = declare.gauge(
            "llmsched_gate_closed",
            "1 on the series of the cause that closed the backend's gate for the class at its last decision, 0 on "
            "the others (all 0: open). `reason` is one of a fixed set (scheduler_svc.policies.GateCause).",
            (*_BY_BACKEND, "priority_class", "reason"),
        )
        self.engine_waiting = backend_gauge(
            "llmsched_engine_waiting", "The engine's waiting requests in its last good metrics reading."
        )
        self.engine_running = backend_gauge(
            "llmsched_engine_running", "The engine's running requests in its last good metrics reading."
        )
        self.engine_tpot = backend_gauge(
            "llmsched_engine_tpot_seconds",
            "The engine's time per output token in its last good metrics reading (NaN: not reported).",
        )
        self.engine_kv_cache_usage = backend_gauge(
            "llmsched_engine_kv_cache_usage",
            "The engine's KV-cache usage 0..1 in its last good metrics reading (NaN: not reported).",
        )
        self.scrape_failures = declare.counter(
            "llmsched_backend_scrape_failures", "Failed reads of an engine's metrics.", _BY_BACKEND
        )
        self.backend_draining = backend_gauge(
            "llmsched_backend_draining",
            "1 while the backend takes no new request (drained by an admin or its configuration, or removed from "
            "the configuration and waiting for its running requests); 0 while it takes work.",
        )
        self.backend_drains = declare.counter(
            "llmsched_backend_drains",
            "Times a backend began to drain, by `source`: admin (DrainBackend, `llmsched backend drain`), config "
            "(`drained = true` in a reloaded file) or removed (left the configuration).",
            (*_BY_BACKEND, "source"),
        )
        self.queued_demand = QueuedDemand()
        self.registry.register(self.queued_demand)

    def forget_backend(self, model: str, backend: str, classes: Iterable[str]) -> None:
        """Drop the gauges of a backend that left the model (its counters stay: they only ever grow)."""
        for gauge in self._backend_gauges:
            _remove(gauge, model, backend)
        for cls in classes:
            for cause in GATE_CLOSE_CAUSES:
                _remove(self.gate_closed, model, backend, cls, cause.value)

    def forget_class(self, model: str, priority_class: str, backends: Iterable[str]) -> None:
        """Drop the gauges of a class that left the model's configuration, once nothing of it is left."""
        _remove(self.queue_depth, model, priority_class)
        for backend in backends:
            for cause in GATE_CLOSE_CAUSES:
                _remove(self.gate_closed, model, backend, priority_class, cause.value)


def _remove(gauge: Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        gauge.remove(*labels)


class BandTotals(Protocol):
    """What `QueuedDemand` reads of a priority class's queue (`queues.Band` is one): running totals, and
    the oldest admission, which costs one look per backlogged user, not per request."""

    @property
    def priority_class(self) -> PriorityClassConfig: ...
    @property
    def size(self) -> int: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def max_output_tokens(self) -> int: ...
    def oldest_admission(self) -> float: ...


_DEMAND_FAMILIES = (
    (
        "llmsched_queued_prompt_tokens",
        "Prompt tokens of the requests queued here (estimated at 4 characters a token, as admission does).",
    ),
    (
        "llmsched_queued_max_output_tokens",
        "Output tokens the requests queued here may generate: their max_tokens summed (the model's "
        "default_max_tokens where a request set none), an upper bound of the decode work waiting.",
    ),
    (
        "llmsched_queue_oldest_wait_seconds",
        "How long the oldest request queued here has waited (0: none queued), whatever the ordering policy.",
    ),
)


class QueuedDemand:
    """The work waiting in the queues, per model and priority class, for autoscalers: a custom collector
    read at scrape time, so admission and dispatch pay nothing beyond the queues' own running totals.

    Each model's dispatcher registers its bands (`watch`). Every configured class has its series from the
    start (0 while nothing is queued); labels are the configured model and class names only. The request
    count per class is `llmsched_queue_depth`, set as requests come and go.
    """

    def __init__(self) -> None:
        self._models: dict[str, tuple[Sequence[BandTotals], Clock]] = {}

    def watch(self, model: str, bands: Sequence[BandTotals], clock: Clock) -> None:
        """Export `model`'s bands from now on (a later call for the same model replaces them)."""
        self._models[model] = (bands, clock)

    def unwatch(self, model: str) -> None:
        """The model left the configuration: export nothing of it any more."""
        self._models.pop(model, None)

    def describe(self) -> Iterator[Metric]:
        for name, doc in _DEMAND_FAMILIES:
            yield GaugeMetricFamily(name, doc, labels=_BY_CLASS)

    def collect(self) -> Iterator[Metric]:
        prompt, output, oldest = (GaugeMetricFamily(name, doc, labels=_BY_CLASS) for name, doc in _DEMAND_FAMILIES)
        for model, (bands, clock) in self._models.items():
            now = clock.now()
            for band in bands:
                labels = [model, band.priority_class.name]
                prompt.add_metric(labels, band.prompt_tokens)
                output.add_metric(labels, band.max_output_tokens)
                oldest.add_metric(labels, max(0.0, now - band.oldest_admission()) if band.size else 0.0)
        yield from (prompt, output, oldest)


class Shown:
    """A value a gauge shows, read when the registry is collected (`Gauge.set_function`): setting it is an
    attribute write, where the gauge's own `set` checks and takes a lock, and the decision path sets several
    of these for every request it sends."""

    __slots__ = ("value",)

    def __init__(self, gauge: Gauge) -> None:
        self.value: float = 0
        gauge.set_function(lambda: self.value)


GATE_CLOSE_CAUSES = tuple(cause for cause in GateCause if cause is not GateCause.OPEN)
"""The values of `llmsched_gate_closed`'s `reason` label: every series exists from the start, so a query
never mistakes a missing series for an open gate."""


@dataclass
class GateCauseSeries:
    """`llmsched_gate_closed` for one backend and class: one child per cause, resolved once."""

    children: dict[GateCause, Shown]
    shown: GateCause | None = field(default=None)

    def show(self, cause: GateCause) -> None:
        """Mark `cause` (OPEN: none) as what the last decision rests on."""
        if cause is self.shown:
            return
        if self.shown is not None and self.shown is not GateCause.OPEN:
            self.children[self.shown].value = 0
        if cause is not GateCause.OPEN:
            self.children[cause].value = 1
        self.shown = cause


@dataclass(frozen=True)
class EngineSeries:
    """One backend's gauges of the engine's own numbers in its last good reading (`Shown`: a scrape writes
    attributes, the registry reads them when collected). All 0 until the first good reading."""

    waiting: Shown
    running: Shown
    tpot: Shown
    kv_cache_usage: Shown

    def show(self, reading: BackendLoad) -> None:
        self.waiting.value = reading.waiting
        self.running.value = reading.running
        self.tpot.value = math.nan if reading.tpot_seconds is None else reading.tpot_seconds
        self.kv_cache_usage.value = math.nan if reading.kv_cache_usage is None else reading.kv_cache_usage


def engine_series(metrics: SchedulerMetrics, model: str, backend: str) -> EngineSeries:
    labels = (model, backend)
    return EngineSeries(
        waiting=Shown(metrics.engine_waiting.labels(*labels)),
        running=Shown(metrics.engine_running.labels(*labels)),
        tpot=Shown(metrics.engine_tpot.labels(*labels)),
        kv_cache_usage=Shown(metrics.engine_kv_cache_usage.labels(*labels)),
    )


@dataclass(frozen=True)
class BackendSeries:
    """One backend's labelled series, resolved once: `labels()` on every token costs real CPU."""

    dispatched: Any
    failovers: Any
    aborts_answered: Any
    aborts_sent: Any
    accept: Any
    generated_tokens: Any
    in_flight: Shown
    gate_open: Shown
    metrics_fresh: Shown
    estimated_waiting: Shown
    draining: Any
    gate_causes: dict[str, GateCauseSeries] = field(default_factory=dict)  # priority class -> its causes

    def show_gate(self, is_open: bool, fresh: bool, waiting: int) -> None:
        """The gate's last decision for a user with nothing at the engine."""
        self.gate_open.value = is_open
        self.metrics_fresh.value = fresh
        self.estimated_waiting.value = waiting

    def show_left_out(self) -> None:
        """The backend is not asked (it drains or cools down): its gate shows closed, the rest as it was."""
        self.gate_open.value = 0


@dataclass(frozen=True)
class ClassSeries:
    """One priority class's labelled series for a model."""

    admitted: Any
    queue_depth: Shown
    queue_wait: Any
    ttft: Any

    def show_depth(self, size: int) -> None:
        """How many requests of the class are queued now."""
        self.queue_depth.value = size


def gate_cause_series(metrics: SchedulerMetrics, model: str, backend: str, priority_class: str) -> GateCauseSeries:
    """`llmsched_gate_closed` of one backend and class, every cause's series at 0 from the start."""
    return GateCauseSeries(
        {
            cause: Shown(metrics.gate_closed.labels(model, backend, priority_class, cause.value))
            for cause in GATE_CLOSE_CAUSES
        }
    )


def backend_series(metrics: SchedulerMetrics, model: str, backend: str, classes: Iterable[str] = ()) -> BackendSeries:
    labels = (model, backend)
    causes = {cls: gate_cause_series(metrics, model, backend, cls) for cls in classes}
    draining = metrics.backend_draining.labels(*labels)
    draining.set(0)
    return BackendSeries(
        dispatched=metrics.dispatched.labels(*labels),
        failovers=metrics.failovers.labels(*labels),
        aborts_answered=metrics.engine_aborts.labels(*labels, "answered"),
        aborts_sent=metrics.engine_aborts.labels(*labels, "sent"),
        accept=metrics.engine_accept.labels(*labels),
        generated_tokens=metrics.generated_tokens.labels(*labels),
        in_flight=Shown(metrics.in_flight.labels(*labels)),
        gate_open=Shown(metrics.gate_open.labels(*labels)),
        metrics_fresh=Shown(metrics.metrics_fresh.labels(*labels)),
        estimated_waiting=Shown(metrics.estimated_waiting.labels(*labels)),
        draining=draining,
        gate_causes=causes,
    )


def class_series(metrics: SchedulerMetrics, model: str, priority_class: str) -> ClassSeries:
    labels = (model, priority_class)
    return ClassSeries(
        admitted=metrics.admitted.labels(*labels),
        queue_depth=Shown(metrics.queue_depth.labels(*labels)),
        queue_wait=metrics.queue_wait.labels(*labels),
        ttft=metrics.ttft.labels(*labels),
    )


_P = ParamSpec("_P")


def _served_here(
    count: Callable[Concatenate[RequestCounters, QueuedRequest, _P], None],
) -> Callable[Concatenate[RequestCounters, QueuedRequest, _P], None]:
    """Count only requests whose call this replica serves: a cluster leader's mirror of another replica's
    request (`QueuedRequest.mirrored`) is counted by that replica."""

    @functools.wraps(count)
    def counted(counters: RequestCounters, request: QueuedRequest, /, *args: _P.args, **kwargs: _P.kwargs) -> None:
        if not request.mirrored:
            count(counters, request, *args, **kwargs)

    return counted


class RequestCounters:
    """One model's per-request series: what each call adds as it is admitted, dispatched, served and ended.

    A cluster leader's dispatcher also runs its mirrors of other replicas' requests; those add nothing here,
    so a sum over replicas counts every call once. Gauges (queue depth, in-flight, gates, engine readings)
    are each dispatcher's own view and are not set here.
    """

    def __init__(
        self,
        metrics: SchedulerMetrics,
        model: str,
        backends: dict[str, BackendSeries],
        classes: dict[str, ClassSeries],
        account_of: Callable[[str], str],
    ) -> None:
        self._metrics = metrics
        self._model = model
        self._backends = backends
        self._classes = classes
        self._account_of = account_of  # user -> its cost label (named users, or one label for the rest)
        # account label -> its child series: cost is counted at every streamed chunk, and labels() validates
        # and locks each time (accounts are the configured ones plus one catch-all, so this stays small)
        self._cost_series: dict[str, Any] = {}

    def use_accounts(self, account_of: Callable[[str], str]) -> None:
        """The cost accounts of a reloaded configuration: cost counted from now on goes to their labels."""
        self._account_of = account_of
        self._cost_series.clear()

    @_served_here
    def admitted(self, request: QueuedRequest) -> None:
        self._classes[request.priority_class].admitted.inc()

    @_served_here
    def dispatched(self, request: QueuedRequest, backend: str, waited: float | None) -> None:
        """Sent to `backend`; `waited` is its queue wait on its first attempt (None on a failover's retry)."""
        self._backends[backend].dispatched.inc()
        if waited is not None:
            self._classes[request.priority_class].queue_wait.observe(waited)

    @_served_here
    def accepted(self, request: QueuedRequest, backend: str, seconds: float) -> None:
        """`backend` answered the request `seconds` after it was sent there (its front end took it in)."""
        self._backends[backend].accept.observe(seconds)

    @_served_here
    def failed_over(self, request: QueuedRequest, backend: str) -> None:
        """`backend` failed the request before its first token and it was queued again."""
        self._backends[backend].failovers.inc()

    @_served_here
    def engine_aborted(self, request: QueuedRequest, backend: str, *, answered: bool) -> None:
        """The request's engine request at `backend` was closed before its end (see `engine_aborts`)."""
        series = self._backends[backend]
        (series.aborts_answered if answered else series.aborts_sent).inc()

    @_served_here
    def first_token(self, request: QueuedRequest, ttft: float) -> None:
        self._classes[request.priority_class].ttft.observe(ttft)

    @_served_here
    def generated(self, request: QueuedRequest, backend: str, tokens: int) -> None:
        self._backends[backend].generated_tokens.inc(tokens)

    @_served_here
    def cost(self, request: QueuedRequest, cost: float) -> None:
        """The cost served (the prompt at the first token, so a failover before it costs nothing)."""
        if cost:
            account = self._account_of(request.user)
            series = self._cost_series.get(account)
            if series is None:
                series = self._cost_series[account] = self._metrics.user_cost.labels(self._model, account)
            series.inc(cost)

    @_served_here
    def outcome(self, request: QueuedRequest, outcome: str) -> None:
        self._metrics.outcomes.labels(self._model, outcome).inc()

"""Every gate decision names its cause from a fixed set (a metric label), and the gauge shows one at a time."""

from __future__ import annotations

from backends.base import BackendLoad
from scheduler_svc.config import GateConfig, PriorityClassConfig
from scheduler_svc.dispatch.load import LoadEstimator
from scheduler_svc.dispatch.metrics import GATE_CLOSE_CAUSES, SchedulerMetrics, backend_series
from scheduler_svc.policies import GateCause, SignalGate


def _decide(reading: BackendLoad | None, cls: PriorityClassConfig, in_flight: int = 0) -> GateCause:
    gate, ledger = SignalGate(GateConfig(waiting_target=3, fallback_max_in_flight=1)), LoadEstimator()
    if reading is not None:
        ledger.record_reading(reading)
        gate.observe(reading)
    for i in range(in_flight):
        ledger.dispatched(f"r{i}")
    return gate.decide(ledger.gate_inputs(100.1), cls).cause


def test_each_signal_closes_the_gate_with_its_own_cause() -> None:
    cls = PriorityClassConfig()
    assert _decide(BackendLoad(ok=True, read_at=100.0), cls) is GateCause.OPEN
    assert _decide(BackendLoad(ok=True, read_at=100.0, waiting=5), cls) is GateCause.ENGINE_WAITING
    assert _decide(None, cls, in_flight=1) is GateCause.STALE_METRICS
    assert _decide(BackendLoad(ok=False, read_at=100.0), cls, in_flight=1) is GateCause.STALE_METRICS
    limited = PriorityClassConfig(max_engine_running=2)
    assert _decide(BackendLoad(ok=True, read_at=100.0, running=2), limited) is GateCause.ENGINE_RUNNING
    kv = PriorityClassConfig(max_kv_cache_usage=0.5)
    assert _decide(BackendLoad(ok=True, read_at=100.0, kv_cache_usage=0.9), kv) is GateCause.KV_CACHE


def test_the_closed_gauge_carries_one_cause_at_a_time_and_every_series_exists() -> None:
    metrics = SchedulerMetrics()
    series = backend_series(metrics, "m", "b0", ["interactive"]).gate_causes["interactive"]

    def value(cause: GateCause) -> float | None:
        labels = {"model": "m", "backend": "b0", "priority_class": "interactive", "reason": cause.value}
        return metrics.registry.get_sample_value("llmsched_gate_closed", labels)

    assert all(value(cause) == 0 for cause in GATE_CLOSE_CAUSES)
    series.show(GateCause.TPOT)
    series.show(GateCause.ENGINE_WAITING)
    assert value(GateCause.ENGINE_WAITING) == 1 and value(GateCause.TPOT) == 0
    series.show(GateCause.OPEN)
    assert all(value(cause) == 0 for cause in GATE_CLOSE_CAUSES)
    assert GateCause.OPEN not in GATE_CLOSE_CAUSES


def test_the_gate_gauges_always_show_the_last_decision_whichever_of_them_changed() -> None:
    metrics = SchedulerMetrics()
    series = backend_series(metrics, "m", "b0")
    labels = {"model": "m", "backend": "b0"}

    def shown() -> tuple[float | None, ...]:
        names = ("llmsched_gate_open", "llmsched_backend_metrics_fresh", "llmsched_backend_estimated_waiting")
        return tuple(metrics.registry.get_sample_value(name, labels) for name in names)

    steps: list[tuple[bool, bool, int] | None] = [
        (True, True, 0),
        (True, True, 3),  # only the waiting estimate moves
        (False, True, 3),
        None,  # left out (draining or cooling down): shown closed
        (False, True, 3),  # the same decision as before the drain: shown again
        (True, False, 3),
        (True, False, 3),
        (False, False, 1),
    ]
    for step in steps:
        if step is None:
            series.show_left_out()
            assert shown()[0] == 0
            continue
        series.show_gate(*step)
        is_open, fresh, waiting = step
        assert shown() == (int(is_open), int(fresh), waiting)

"""The engine's own numbers as the scheduler shows them: from its last good reading, read at collection."""

from __future__ import annotations

import math

from backends.base import BackendLoad
from scheduler_svc.dispatch.metrics import SchedulerMetrics, engine_series

NAMES = (
    "llmsched_engine_waiting",
    "llmsched_engine_running",
    "llmsched_engine_tpot_seconds",
    "llmsched_engine_kv_cache_usage",
)


def test_the_gauges_show_the_last_good_reading_and_nan_for_what_the_engine_does_not_report() -> None:
    metrics = SchedulerMetrics()
    series = engine_series(metrics, "m", "b0")

    def shown() -> list[float | None]:
        return [metrics.registry.get_sample_value(name, {"model": "m", "backend": "b0"}) for name in NAMES]

    assert shown() == [0, 0, 0, 0]  # nothing read yet
    series.show(BackendLoad(ok=True, read_at=1.0, waiting=4, running=8, tpot_seconds=0.03, kv_cache_usage=0.5))
    assert shown() == [4, 8, 0.03, 0.5]
    series.show(BackendLoad(ok=True, read_at=2.0, waiting=1, running=2))
    waiting, running, tpot, kv = shown()
    assert (waiting, running) == (1, 2) and tpot is not None and math.isnan(tpot) and kv is not None and math.isnan(kv)

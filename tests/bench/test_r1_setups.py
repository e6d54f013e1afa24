"""R1's scheduler setups measure the scheduler as it ships: reading the engine's metrics as often as the
shipped config does (the bench's own sampler keeps its 0.1 s period)."""

from __future__ import annotations

from bench.scenarios.r1 import setups as r1_setups
from tests.helpers import example_config


def test_the_scheduler_setups_read_the_engine_as_the_shipped_config_does() -> None:
    shipped = example_config()
    intervals = {b["scrape_interval_seconds"] for m in shipped["models"] for b in m["backends"]}
    assert intervals == {r1_setups.SCHED.scrape_interval}
    assert r1_setups.SCHED_OFF.scrape_interval == r1_setups.SCHED.scrape_interval
    assert r1_setups.SCHED_SCRAPE_01.scrape_interval == 0.1 != r1_setups.SCHED.scrape_interval

"""The queued-demand gauges an autoscaler reads: per model and class, requests, prompt tokens and the most
output tokens queued, and the oldest request's wait, on the fake clock through a real dispatcher."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from backends.errors import BackendUnavailable
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.core.clock import FakeClock
from scheduler_svc.core.ticket import Outcome
from scheduler_svc.dispatch.dispatcher import ModelDispatcher
from scheduler_svc.dispatch.metrics import SchedulerMetrics
from tests.unit.dispatch_harness import Harness

CLASSES = [{"name": "interactive", "rank": 0}, {"name": "batch", "rank": 1}]
DEMAND = (
    "llmsched_queue_depth",
    "llmsched_queued_prompt_tokens",
    "llmsched_queued_max_output_tokens",
    "llmsched_queue_oldest_wait_seconds",
)


def demand(h: Harness, priority_class: str = "interactive") -> tuple[float, ...]:
    """(requests, prompt tokens, max output tokens, oldest wait) for model m and the class, as scraped."""
    registry = h.metrics.registry
    values = (registry.get_sample_value(name, {"model": "m", "priority_class": priority_class}) for name in DEMAND)
    return tuple(v if v is not None else float("nan") for v in values)


def harness(cap: int = 1, **scheduling: object) -> Harness:
    return Harness({"classes": CLASSES, "default_class": "interactive", **scheduling}, cap=cap)


def test_every_configured_class_has_its_series_at_zero_before_anything_is_queued() -> None:
    h = harness()
    assert demand(h, "interactive") == demand(h, "batch") == (0, 0, 0, 0)
    text = generate_latest(h.metrics.registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in DEMAND[1:]:
        labels = {tuple(sorted(s.labels.items())) for s in families[name].samples}
        assert labels == {(("model", "m"), ("priority_class", c)) for c in ("interactive", "batch")}, name


def test_totals_follow_admission_dispatch_failover_and_the_end_of_requests() -> None:
    h = harness(cap=1)
    first = h.submit("alice", max_tokens=100, prompt="x" * 400)  # 100 prompt tokens
    h.clock.advance(3.0)
    h.submit("bob", max_tokens=20, prompt="y" * 40)  # 10
    h.submit("carol", max_tokens=7, prompt="z" * 80, priority_class="batch")  # 20
    h.clock.advance(2.0)
    assert demand(h) == (2, 110, 120, 5.0)
    assert demand(h, "batch") == (1, 20, 7, 2.0)

    assert h.dispatch() == [first]  # alice's leaves the queue: bob's, 2 s old, is the oldest now
    assert demand(h) == (1, 10, 20, 2.0)

    assert h.events.fail_over(first, BackendUnavailable("connection refused"))
    assert demand(h) == (2, 110, 120, 5.0), "put back: counted again, its wait from its first admission"

    h.tickets["bob-1"].close(Outcome.CANCELLED)
    assert demand(h) == (1, 100, 100, 5.0)
    h.clock.advance(1.5)
    assert demand(h) == (1, 100, 100, 6.5), "the wait grows with the clock, no event needed"


def test_expired_requests_leave_the_totals() -> None:
    h = harness(cap=0)  # nothing is ever dispatched
    h.submit("alice", max_tokens=5, prompt="a" * 8, timeout=1.0)
    h.clock.advance(0.5)
    h.submit("alice", max_tokens=9, prompt="b" * 12)
    assert demand(h) == (2, 5, 14, 0.5)
    h.clock.advance(1.0)
    h.events.expire(h.tickets["alice-0"])
    assert demand(h) == (1, 3, 9, 1.0)


def test_the_oldest_wait_is_the_oldest_admission_whatever_the_order() -> None:
    """Under edf a younger request with a deadline goes first; the gauge still shows the oldest's wait."""
    h = harness(cap=1, ordering="edf")
    old = h.submit("alice")  # no deadline: last under edf
    h.clock.advance(4.0)
    young = h.submit("alice", timeout=10.0)
    assert (young.position(), old.position()) == (1, 2)
    assert demand(h)[3] == 4.0
    assert h.dispatch() == [young]
    h.clock.advance(1.0)
    assert demand(h)[3] == 5.0 and old.position() == 1


def test_models_share_one_registry_and_keep_their_own_series() -> None:
    raw = {
        "models": [
            {"name": "m", "backends": [{"name": "b0"}]},
            {"name": "n", "backends": [{"name": "b0"}]},
        ]
    }
    config = config_from_dict(raw)
    clock, metrics = FakeClock(), SchedulerMetrics()
    for model in config.models:
        ModelDispatcher(model, config.scheduling, [], clock, metrics)
    text = generate_latest(metrics.registry).decode()
    samples = [s for f in text_string_to_metric_families(text) if f.name == DEMAND[1] for s in f.samples]
    classes = [c.name for c in config.scheduling.classes]
    assert sorted((s.labels["model"], s.labels["priority_class"]) for s in samples) == sorted(
        (m, c) for m in ("m", "n") for c in classes
    )

"""The per-backend load estimator alone: per-user in-flight counts, gate inputs built in one place, and
readings stamped with the core clock (no sockets, fake clock)."""

from __future__ import annotations

import random
import time

from backends.base import BackendCapabilities, BackendLoad
from backends.fake import FakeBackend
from scheduler_svc.core.clock import FakeClock
from scheduler_svc.dispatch.load import LoadEstimator, _seen_by, scrape
from tests.unit.dispatch_harness import never_generates


def test_users_are_counted_while_their_requests_are_in_flight() -> None:
    estimator = LoadEstimator()
    estimator.dispatched("a1", user="alice")
    estimator.dispatched("a2", engine_priority=3, user="alice")
    estimator.dispatched("b1", user="bob")
    estimator.dispatched("anon")  # no user given: counted in flight, not per user
    assert estimator.user_in_flight == {"alice": 2, "bob": 1} and estimator.in_flight == 4
    estimator.finished("a1", 1.0)
    estimator.finished("b1", 1.0)
    estimator.finished("anon", 1.0)
    assert estimator.user_in_flight == {"alice": 1} and estimator.in_flight == 1


def test_gate_inputs_carry_the_class_and_candidate_fields() -> None:
    estimator = LoadEstimator(engine_slots=4)
    estimator.record_reading(BackendLoad(ok=True, read_at=10.0, waiting=1, running=4))
    estimator.dispatched("r", engine_priority=7, user="u")
    inputs = estimator.gate_inputs(10.5, True, better_tpot_limit=0.05, candidate_priority=2)
    assert (inputs.now, inputs.better_class_active, inputs.better_tpot_limit) == (10.5, True, 0.05)
    assert inputs.candidate_priority == 2 and inputs.unstarted_priorities == (7,)
    assert inputs.reading_age() == 0.5 and inputs.sent_unseen == 1
    plain = estimator.gate_inputs(10.5)
    assert not plain.better_class_active and plain.better_tpot_limit == 0.0 and plain.candidate_priority is None


async def test_a_reading_is_stamped_with_the_core_clock_before_the_scrape() -> None:
    clock = FakeClock(start=50.0)

    def load() -> BackendLoad:
        clock.advance(2.0)  # the scrape takes a while to answer
        return BackendLoad(ok=True, read_at=time.monotonic(), waiting=3)

    backend = FakeBackend(never_generates, load, capabilities=BackendCapabilities())
    reading = await scrape(backend, clock)
    assert reading.read_at == 50.0 and reading.waiting == 3
    estimator = LoadEstimator()
    estimator.record_reading(reading)
    assert estimator.gate_inputs(clock.now()).reading_age() == 2.0


def _walked(estimator: LoadEstimator) -> tuple[int, int]:
    """(unseen in flight, sent unseen) the slow way: every request in flight looked at."""
    reading = estimator.reading
    unseen = [rid for rid, at in estimator._in_flight.items() if not _seen_by(at, reading)]
    return len(unseen), sum(rid in estimator._unstarted for rid in unseen)


def test_the_unseen_tallies_kept_as_events_come_match_a_walk_over_every_request() -> None:
    """Accepts reported late (a follower's, through the cluster) can land before a reading's time; ids can be
    dispatched again after a failover; readings come out of order or fail. Whatever the order, the tallies a
    gate decision reads equal what walking every request in flight counts."""
    rng = random.Random(7)
    estimator = LoadEstimator(engine_slots=8)
    now = 0.0
    live: list[str] = []
    for step in range(5000):
        now += rng.random() * 0.02
        action = rng.random()
        if action < 0.3 or not live:
            rid = f"r{rng.randrange(400)}"
            if rid not in live:
                live.append(rid)
            estimator.dispatched(rid, user=f"u{rng.randrange(5)}")
        elif action < 0.5:
            estimator.accepted(rng.choice(live), now - rng.random() * 0.3)
        elif action < 0.65:
            estimator.started(rng.choice(live), None if rng.random() < 0.2 else now - rng.random() * 0.2)
        elif action < 0.8:
            rid = live.pop(rng.randrange(len(live)))
            estimator.finished(rid, now)
        else:
            at = now - rng.random() * 0.5
            estimator.record_reading(BackendLoad(ok=rng.random() < 0.9, read_at=at, waiting=rng.randrange(4)))
        inputs = estimator.gate_inputs(now)
        assert (inputs.unseen_in_flight, inputs.sent_unseen) == _walked(estimator), step

"""The per-backend load estimator alone: per-user in-flight counts, gate inputs built in one place, and
readings stamped with the core clock (no sockets, fake clock)."""

from __future__ import annotations

import time

from backends.base import BackendCapabilities, BackendLoad
from backends.fake import FakeBackend
from scheduler_svc.core.clock import FakeClock
from scheduler_svc.dispatch.load import LoadEstimator, scrape


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

    async def never(_: object) -> object:  # pragma: no cover - no generation here
        raise AssertionError

    backend = FakeBackend(never, load, capabilities=BackendCapabilities())  # type: ignore[arg-type]
    reading = await scrape(backend, clock)
    assert reading.read_at == 50.0 and reading.waiting == 3
    estimator = LoadEstimator()
    estimator.record_reading(reading)
    assert estimator.gate_inputs(clock.now()).reading_age() == 2.0

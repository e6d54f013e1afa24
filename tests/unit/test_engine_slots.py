"""An engine's slots (max_num_seqs), learned from its readings when the config does not say: unknown until a
reading shows work waiting beside a KV cache with room, then the most requests any reading showed running,
only growing; configured slots, or learning switched off, are never changed by a reading."""

from __future__ import annotations

from backends.base import BackendLoad
from scheduler_svc.dispatch.engine_slots import EngineSlots
from scheduler_svc.dispatch.load import LoadEstimator


def reading(running: int, waiting: int, at: float = 1.0, *, kv: float | None = None, ok: bool = True) -> BackendLoad:
    return BackendLoad(ok=ok, read_at=at, waiting=waiting, running=running, kv_cache_usage=kv)


def test_unknown_until_the_engine_queues_work_then_the_most_it_ran() -> None:
    slots = EngineSlots(learn=True)
    assert not slots.observe(reading(running=3, waiting=0))
    assert slots.count == 0, "an engine that never queued work may have free slots: unknown"
    assert slots.observe(reading(running=4, waiting=2, kv=0.3))
    assert slots.count == 4


def test_a_running_count_seen_before_saturation_counts() -> None:
    slots = EngineSlots(learn=True)
    slots.observe(reading(running=4, waiting=0))
    slots.observe(reading(running=3, waiting=1))  # read between a finish and the engine's next step
    assert slots.count == 4


def test_the_count_only_grows() -> None:
    slots = EngineSlots(learn=True)
    slots.observe(reading(running=3, waiting=1))  # one short, read between steps: a lower bound
    assert slots.count == 3
    assert not slots.observe(reading(running=2, waiting=5))
    assert slots.count == 3
    assert slots.observe(reading(running=4, waiting=0))
    assert slots.count == 4


def test_work_waiting_for_kv_cache_is_no_sign_of_full_slots() -> None:
    slots = EngineSlots(learn=True)
    slots.observe(reading(running=2, waiting=6, kv=0.97))
    assert slots.count == 0
    slots.observe(reading(running=2, waiting=6, kv=0.5))
    assert slots.count == 2


def test_waiting_with_nothing_running_or_a_failed_scrape_teaches_nothing() -> None:
    slots = EngineSlots(learn=True)
    slots.observe(reading(running=0, waiting=3))  # an engine starting its first step
    slots.observe(reading(running=9, waiting=9, ok=False))
    assert slots.count == 0


def test_configured_slots_or_learning_off_are_left_alone() -> None:
    configured = EngineSlots(8, learn=True)
    configured.observe(reading(running=12, waiting=3))
    assert configured.count == 8
    off = EngineSlots(learn=False)
    off.observe(reading(running=4, waiting=3))
    assert off.count == 0


def test_the_estimator_takes_learned_slots_into_its_waiting_estimate() -> None:
    """Learned slots act like configured ones: requests that fit free slots next to a reading with nothing
    waiting do not count as waiting."""
    estimator = LoadEstimator(learn_slots=True)
    estimator.record_reading(reading(running=4, waiting=1, at=1.0))
    assert estimator.engine_slots == 4
    estimator.record_reading(reading(running=1, waiting=0, at=2.0))  # three slots free now
    for i in range(3):
        estimator.dispatched(f"r{i}")
    assert estimator.gate_inputs(2.1).estimated_waiting() == 0
    unknown = LoadEstimator()
    unknown.record_reading(reading(running=4, waiting=1, at=1.0))
    unknown.record_reading(reading(running=1, waiting=0, at=2.0))
    for i in range(3):
        unknown.dispatched(f"r{i}")
    assert unknown.engine_slots == 0 and unknown.gate_inputs(2.1).estimated_waiting() == 3


def test_a_reload_keeps_what_the_readings_taught_and_applies_configured_slots() -> None:
    """A reload that still leaves the slots to the engine keeps the count learned before it; configured slots
    win while set; set back to 0, the count the readings showed is back without a new saturation."""
    estimator = LoadEstimator(learn_slots=True)
    estimator.record_reading(reading(running=4, waiting=2, at=1.0))
    estimator.configure_slots(0, learn=True)
    assert estimator.engine_slots == 4
    estimator.configure_slots(6, learn=True)
    assert estimator.engine_slots == 6
    estimator.record_reading(reading(running=7, waiting=2, at=2.0))
    assert estimator.engine_slots == 6, "configured slots are not learned over"
    estimator.configure_slots(0, learn=True)
    assert estimator.engine_slots == 4
    estimator.configure_slots(0, learn=False)
    assert estimator.engine_slots == 0


def test_slots_learned_from_a_late_reading_tell_the_watchers() -> None:
    """An older scrape answering after a newer one leaves the reading as it was, but the slots it teaches
    change the gate's answers: kept answers must be asked again."""
    estimator = LoadEstimator(learn_slots=True)
    told: list[int] = []
    estimator.watch(lambda: told.append(estimator.engine_slots), lambda user, count: None)
    estimator.record_reading(reading(running=3, waiting=0, at=2.0))
    assert told == [0]
    estimator.record_reading(reading(running=4, waiting=2, at=1.0))  # late: taken before the one above
    assert estimator.engine_slots == 4
    assert told == [0, 4], "the watchers hear of the learned slots"
    assert estimator.reading is not None and estimator.reading.read_at == 2.0, "the newer reading stands"
    estimator.record_reading(reading(running=2, waiting=1, at=1.5))  # late and teaches nothing
    assert told == [0, 4]

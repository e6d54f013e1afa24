"""At a priority engine a request queues only behind what the engine would serve first.

vLLM's priority policy serves its waiting queue by priority (lower first, ties in arrival order). A
latecomer whose priority beats a flood's queued requests therefore need not wait in our queue for the
engine's queue to drain below the target: sent at once it takes the next free slot, as vLLM's own
priority field would give it. These tests drive the dispatcher on a fake clock with the real gate.
"""

from __future__ import annotations

import dataclasses

import pytest

from backends.base import BackendLoad
from scheduler_svc.config import GateConfig, PriorityClassConfig
from scheduler_svc.dispatch.health import LoopHealth, ServiceHealth
from scheduler_svc.dispatch.load import LoadEstimator
from scheduler_svc.policies import SignalGate
from tests.unit.dispatch_harness import Harness

CLS = PriorityClassConfig()


def _ledger_with_a_flood(foreign_waiting: int = 0) -> LoadEstimator:
    """Four of user A's requests run, two wait at the engine with priorities 4 and 5."""
    ledger = LoadEstimator(engine_slots=4)
    for i in range(6):
        ledger.dispatched(f"a{i}", engine_priority=i)
        ledger.accepted(f"a{i}", 99.0)
    for i in range(4):
        ledger.started(f"a{i}", 99.5)
    ledger.record_reading(BackendLoad(ok=True, read_at=100.0, waiting=2 + foreign_waiting, running=4))
    return ledger


@pytest.mark.parametrize(
    ("candidate", "ahead"),
    [(None, 2), (0, 0), (3, 0), (4, 1), (5, 2), (9, 2)],
)
def test_waiting_ahead_counts_ours_with_a_priority_as_good_or_better(candidate: int | None, ahead: int) -> None:
    inputs = _ledger_with_a_flood().gate_inputs(100.1)
    inputs = dataclasses.replace(inputs, candidate_priority=candidate)
    assert inputs.estimated_waiting() == 2
    assert inputs.waiting_ahead() == ahead


def test_other_clients_waiting_requests_count_as_ahead_of_anyone() -> None:
    inputs = _ledger_with_a_flood(foreign_waiting=1).gate_inputs(100.1)
    inputs = dataclasses.replace(inputs, candidate_priority=0)
    assert inputs.waiting_ahead() == 1


def test_the_gate_opens_for_a_better_priority_only_and_never_for_batch() -> None:
    gate = SignalGate(GateConfig(waiting_target=2, priority_waiting_target=2))
    base = _ledger_with_a_flood().gate_inputs(100.1)
    flood_next = dataclasses.replace(base, candidate_priority=6)
    latecomer = dataclasses.replace(base, candidate_priority=0)
    assert not gate.decide(flood_next, CLS).open
    assert gate.decide(latecomer, CLS).open
    batch = PriorityClassConfig("batch", rank=2, require_idle_engine=True)
    assert not gate.decide(latecomer, batch).open  # batch still needs an empty engine queue


def test_a_priority_engine_takes_its_own_deeper_target_and_a_fifo_engine_keeps_the_plain_one() -> None:
    """`priority_waiting_target` lets the flood's own next request queue deeper at a priority engine (two
    wait, target 3), while the same reading at a FIFO engine (no candidate priority) holds at 2; a class's
    own target still wins over both. Left at 0 it is derived from the engine's slots (6 at 4), and is
    `waiting_target` while they are unknown."""
    gate = SignalGate(GateConfig(waiting_target=2, priority_waiting_target=3))
    base = _ledger_with_a_flood().gate_inputs(100.1)
    flood_next = dataclasses.replace(base, candidate_priority=6)
    at_fifo_engine = dataclasses.replace(base, candidate_priority=None)
    assert flood_next.waiting_ahead() == at_fifo_engine.waiting_ahead() == 2
    assert gate.decide(flood_next, CLS).open
    assert not gate.decide(at_fifo_engine, CLS).open
    assert not gate.decide(flood_next, PriorityClassConfig(waiting_target=2)).open
    derived = SignalGate(GateConfig(waiting_target=2))
    assert flood_next.engine_slots == 4 and derived.decide(flood_next, CLS).open  # 2 ahead, target 6
    slots_unknown = dataclasses.replace(flood_next, engine_slots=0, waiting_bound=None)
    assert not derived.decide(slots_unknown, CLS).open  # 2 ahead, target 2


def _flood_then_latecomers(priority_scheduling: bool, fairness: str, health: LoopHealth | None = None) -> Harness:
    harness = Harness(
        scheduling={"fairness": fairness},
        model={"gate": {"policy": "signals", "waiting_target": 3}},
        cap=None,
        priority_scheduling=priority_scheduling,
        health=health,
    )
    harness.reading(waiting=0, tpot=0.005)  # a TPOT far under the interactive limit: only the queue binds
    for _ in range(10):
        harness.submit("flood")
    assert [t.request.user for t in harness.dispatch()] == ["flood"] * 3  # the queue target holds the flood
    return harness


@pytest.mark.parametrize("fairness", ["round_robin", "vtc"])
def test_a_latecomer_goes_at_once_to_a_priority_engine_while_the_flood_waits(fairness: str) -> None:
    harness = _flood_then_latecomers(priority_scheduling=True, fairness=fairness)
    assert not harness.dispatch()  # nothing more of the flood may go
    for user in ("b", "c"):
        harness.submit(user)
        sent = harness.dispatch()
        assert [t.request.user for t in sent] == [user]
        assert sent[0].engine_priority == 0  # ahead of the flood's second and third (priorities 1 and 2)
    harness.submit("d")
    assert not harness.dispatch(), "three already wait with priority 0 or better: d would queue behind them"
    assert harness.user_depth("flood") == 7


def test_without_engine_priorities_the_latecomer_waits_for_the_engine_queue() -> None:
    harness = _flood_then_latecomers(priority_scheduling=False, fairness="round_robin")
    harness.submit("b")
    assert not harness.dispatch()  # a FIFO engine would queue it behind all three
    harness.step()  # the first three start: the engine's queue is empty again
    assert "b" in [t.request.user for t in harness.dispatch()][:2]  # its turn comes, after at most one flood


def test_a_user_skipped_for_its_priority_keeps_its_round_robin_turn() -> None:
    harness = _flood_then_latecomers(priority_scheduling=True, fairness="round_robin")
    harness.submit("b")
    harness.submit("b")
    # b's first goes at priority 0; its second would carry 1, behind the flood's 0 and 1 and b's 0
    assert [t.request.user for t in harness.dispatch()] == ["b"]
    harness.step()  # all four start: the queue is empty, everyone may go
    order = [t.request.user for t in harness.dispatch()]
    assert order[:2] == ["flood", "b"], order  # the flood was first in the ring and stayed there


def test_a_lone_flood_held_at_a_priority_engine_is_not_a_stall() -> None:
    """A newcomer would pass the gate, but the only backlogged user's next request would not: the watchdog
    must not call that a wedged loop (it would turn the service NOT_SERVING during any long flood)."""
    service = ServiceHealth()
    health = LoopHealth("dispatch:m", service, max_failed_passes=3, max_stall_seconds=30.0)
    harness = _flood_then_latecomers(priority_scheduling=True, fairness="round_robin", health=health)
    dispatcher = harness.dispatcher
    for second in range(10, 130, 10):
        harness.reading(waiting=0, tpot=0.005)  # fresh readings; the flood's three are still on their way
        dispatcher.watchdog_look()
        assert service.serving, f"flagged as stalled after {second} s: {service.problems}"
        harness.clock.advance(10.0)
    harness.reading(waiting=0, tpot=0.005)
    harness.submit("b")  # a user the gate admits: now work could go, and the loop would send it
    assert [t.request.user for t in harness.dispatch()] == ["b"]

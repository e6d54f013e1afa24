"""At a FIFO engine the gate keeps the engine's queue only as deep as its slots need (WaitingDepth): lower
while the slots stay busy, deeper when a freed slot finds nothing waiting while work was held back."""

from __future__ import annotations

import dataclasses

from backends.base import BackendLoad
from scheduler_svc.config import GateConfig, PriorityClassConfig
from scheduler_svc.policies import SignalGate
from scheduler_svc.policies.gate import GateCause, GateDecision, GateInputs
from scheduler_svc.policies.waiting_depth import WaitingDepth
from tests.unit.dispatch_harness import Harness

SLOTS = 4
CLS = PriorityClassConfig()


def reading(at: float, running: int, waiting: int) -> BackendLoad:
    return BackendLoad(ok=True, read_at=at, running=running, waiting=waiting)


def feed(depth: WaitingDepth, readings: list[BackendLoad], held: bool = True) -> None:
    """Each reading scraped and then looked at by a dispatch decision (an unbroken run)."""
    for r in readings:
        depth.scraped(r)
        depth.observe(r, SLOTS, held)


def busy(start: float, seconds: float, waiting: int = 1, every: float = 0.2) -> list[BackendLoad]:
    return [reading(start + i * every, SLOTS, waiting) for i in range(int(seconds / every) + 1)]


def test_busy_slots_lower_the_depth_one_step_per_period_down_to_one() -> None:
    depth = WaitingDepth(ceiling=3, lower_after_seconds=2.0)
    feed(depth, busy(0.0, 1.9))
    assert depth.target == 3  # not yet a whole period
    feed(depth, busy(2.0, 0.0))
    assert depth.target == 2
    feed(depth, busy(2.2, 10.0))
    assert depth.target == 1  # never below one


def test_a_freed_slot_with_nothing_waiting_while_work_was_held_deepens_the_queue() -> None:
    depth = WaitingDepth(ceiling=3, lower_after_seconds=2.0)
    feed(depth, busy(0.0, 4.2))
    assert depth.target == 1
    feed(depth, [reading(4.4, SLOTS - 1, 0)])  # the slot freed, the queue had run dry: starved
    assert depth.target == 2
    feed(depth, [reading(4.6, SLOTS - 1, 0)])  # still starved: one more per starved reading
    assert depth.target == 3
    feed(depth, [reading(4.8, SLOTS, 0), reading(5.0, SLOTS - 2, 0)])
    assert depth.target == 3  # never above the configured target


def test_only_an_unbroken_run_of_readings_teaches_the_depth() -> None:
    depth = WaitingDepth(ceiling=3, lower_after_seconds=2.0)
    feed(depth, busy(0.0, 1.0))
    for r in busy(1.2, 5.0):  # five seconds of scrapes no decision looked at (nothing was held)
        depth.scraped(r)
    feed(depth, busy(6.4, 0.0))
    assert depth.target == 3  # the unseen seconds are not taken for busy slots
    lowered = WaitingDepth(ceiling=3, lower_after_seconds=2.0)
    feed(lowered, busy(0.0, 4.2))
    assert lowered.target == 1
    lowered.scraped(reading(4.4, 0, 0))  # the engine drained unseen...
    feed(lowered, [reading(4.6, 0, 0), reading(4.8, 2, 0)])  # ...and fills again for a new flood
    assert lowered.target == 1  # filling up from idle is not starving


def test_what_is_not_starvation_leaves_the_depth_alone() -> None:
    depth = WaitingDepth(ceiling=3, lower_after_seconds=2.0)
    feed(depth, busy(0.0, 4.2))
    assert depth.target == 1
    # the engine between a finish and its next step, its own queue about to fill the slot
    feed(depth, [reading(4.4, SLOTS - 1, 1)])
    # a free slot the gate left empty on purpose (a TPOT or running limit held the work back)
    feed(depth, [reading(4.6, SLOTS, 1), reading(4.8, SLOTS - 1, 0)], held=False)
    assert depth.target == 1
    # an engine filling up from idle (after scrapes nobody looked at) has not been full in this run
    depth.scraped(reading(4.9, 0, 0))
    feed(depth, [reading(5.0, 0, 0), reading(5.2, 2, 0)])
    assert depth.target == 1


def test_no_slot_count_or_adaptation_off_keeps_the_configured_target() -> None:
    unknown_slots = WaitingDepth(ceiling=3, lower_after_seconds=2.0)
    for r in busy(0.0, 10.0):
        unknown_slots.scraped(r)
        unknown_slots.observe(r, 0, True)
    off = WaitingDepth(ceiling=3, lower_after_seconds=0.0)
    feed(off, busy(0.0, 10.0))
    assert unknown_slots.target == 3 and off.target == 3


def _inputs(at: float, running: int, waiting: int) -> GateInputs:
    return GateInputs(
        reading=reading(at, running, waiting),
        now=at + 0.01,
        in_flight=running + waiting,
        sent_unseen=0,
        started_since_reading=0,
        engine_slots=SLOTS,
        started_in_flight=running,
        unstarted=waiting,
        holding_work=True,
    )


def _decide(gate: SignalGate, inputs: GateInputs) -> GateDecision:
    """The reading scraped (the gate observes every scrape), then a decision on it."""
    assert inputs.reading is not None
    gate.observe(inputs.reading)
    return gate.decide(inputs, CLS)


def test_the_signal_gate_holds_a_fifo_engine_at_the_learned_depth_once_its_slots_stay_busy() -> None:
    gate = SignalGate(GateConfig(waiting_target=3, priority_waiting_target=6, waiting_target_adapt_seconds=2.0))
    # at first the configured target: a queue of 2 at the engine leaves the gate open
    assert _decide(gate, _inputs(0.0, SLOTS, 2)).open
    for i in range(1, 22):  # four seconds of busy slots with one waiting, the dispatcher holding work
        _decide(gate, _inputs(i * 0.2, SLOTS, 1))
    decision = _decide(gate, _inputs(4.4, SLOTS, 1))
    assert not decision.open and decision.cause is GateCause.ENGINE_WAITING, decision.reason
    assert gate.decide(_inputs(4.4, SLOTS, 0), CLS).open  # nothing queued there: one may go
    # a request bound for a priority engine still queues behind its own target, not the learned depth
    assert gate.decide(
        dataclasses.replace(_inputs(4.4, SLOTS, 2), candidate_priority=5, unstarted_priorities=(5, 5)), CLS
    ).open


def test_introspection_and_priority_engines_do_not_teach_the_depth() -> None:
    introspected = SignalGate(GateConfig(waiting_target=3, waiting_target_adapt_seconds=2.0))
    priority = SignalGate(GateConfig(waiting_target=3, waiting_target_adapt_seconds=2.0))
    for i in range(30):
        _decide(introspected, dataclasses.replace(_inputs(i * 0.2, SLOTS, 1), holding_work=False))
        _decide(priority, dataclasses.replace(_inputs(i * 0.2, SLOTS, 1), candidate_priority=0))
    assert introspected.waiting.depth.target == 3 and priority.waiting.depth.target == 3
    assert introspected.decide(_inputs(6.2, SLOTS, 2), CLS).open


def _flooded_engine_readings(teach: bool) -> int:
    """A flood held at a FIFO engine whose every reading for 2.4 s shows its slots full and its queue at the
    target: each reading followed by a dispatch round (`teach`) or only by introspection (GetQueueState).
    Returns the depth the gate keeps afterwards."""
    h = Harness(cap=None, model={"gate": {"waiting_target": 3}})
    h.handle.estimator.engine_slots = SLOTS
    for _ in range(12):
        h.submit("flood", max_tokens=1000)
    h.reading()
    h.dispatch()
    h.step(0.1)  # the requests sent so far start
    h.reading(running=SLOTS, waiting=len(h.running()) - SLOTS, tpot=0.01)  # far under the class's limit
    h.dispatch()
    assert len(h.running()) == SLOTS + 3  # the slots and the queue at the target filled; the rest held
    for _ in range(13):
        h.step(0.2)
        h.reading(running=SLOTS, waiting=3, tpot=0.01)
        if teach:
            h.dispatch()
        else:
            h.gates()
    gate = h.handle.gate
    assert isinstance(gate, SignalGate)
    return gate.waiting.depth.target


def test_the_dispatcher_holding_work_teaches_the_depth_and_introspection_does_not() -> None:
    assert _flooded_engine_readings(teach=True) == 2
    assert _flooded_engine_readings(teach=False) == 3

"""The signal gate's priority bound (`PriorityBoundGate`): one decision at a priority engine says how the gate
decides the same inputs for every worse engine priority, which dispatch reads instead of asking the gate for
each user with requests in flight there."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from backends.base import BackendLoad
from scheduler_svc.config import GateConfig, PriorityClassConfig
from scheduler_svc.policies import GateInputs, SignalGate

NOW = 100.0


@st.composite
def priority_inputs(draw: st.DrawFn) -> tuple[GateInputs, PriorityClassConfig, GateConfig]:
    unstarted_priorities = tuple(sorted(draw(st.lists(st.integers(0, 12), max_size=8))))
    unstarted = len(unstarted_priorities) + draw(st.integers(0, 3))  # some sent without a known priority
    waiting = draw(st.integers(0, 14))
    fresh = draw(st.booleans())
    reading = BackendLoad(
        ok=True, read_at=NOW - (0.1 if fresh else 60.0), waiting=waiting, running=draw(st.integers(0, 8))
    )
    inputs = GateInputs(
        reading=reading,
        now=NOW,
        in_flight=unstarted + draw(st.integers(0, 4)),
        sent_unseen=draw(st.integers(0, unstarted)),
        started_since_reading=0,
        engine_slots=8,
        unstarted=unstarted,
        unstarted_priorities=unstarted_priorities,
        candidate_priority=draw(st.integers(0, 12)),
    )
    cls = PriorityClassConfig(
        waiting_target=draw(st.sampled_from([0, 1, 3])),
        require_idle_engine=draw(st.booleans()),
        max_engine_running=draw(st.sampled_from([0, 6])),
    )
    config = GateConfig(waiting_target=draw(st.integers(1, 6)), priority_waiting_target=draw(st.sampled_from([0, 5])))
    return inputs, cls, config


@settings(max_examples=400, deadline=None)
@given(priority_inputs(), st.integers(0, 8))
def test_the_bound_from_one_decision_matches_the_gate_at_every_worse_priority(
    case: tuple[GateInputs, PriorityClassConfig, GateConfig], worse_by: int
) -> None:
    inputs, cls, config = case
    gate = SignalGate(config)
    decision = gate.decide(inputs, cls)
    bound = gate.admits_below(inputs, decision, cls)
    assert inputs.candidate_priority is not None
    worse = inputs.candidate_priority + worse_by
    asked = gate.decide(replace(inputs, candidate_priority=worse), cls)
    assert asked.open == (worse < bound), (decision, asked, bound, worse)


def test_a_full_queue_of_better_requests_closes_worse_ones_and_admits_better_ones() -> None:
    config = GateConfig(waiting_target=2, priority_waiting_target=2)  # stated: 0 would derive 12 from 8 slots
    reading = BackendLoad(ok=True, read_at=NOW - 0.1, waiting=3, running=8)
    inputs = GateInputs(
        reading=reading,
        now=NOW,
        in_flight=3,
        sent_unseen=0,
        started_since_reading=0,
        engine_slots=8,
        unstarted=3,
        unstarted_priorities=(1, 4, 9),
        candidate_priority=0,
    )
    gate, cls = SignalGate(config), PriorityClassConfig()
    decision = gate.decide(inputs, cls)
    assert decision.open
    assert gate.admits_below(inputs, decision, cls) == 4.0  # two of ours at <= 4 would be ahead: the target

"""Band choice, backend choice and the gates' openings alone: plain views, fake clock, no dispatcher."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest

from backends.base import BackendCapabilities, BackendLoad, SamplingParams
from backends.fake import FakeBackend
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.config import ConfigError, PriorityClassConfig
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.dispatch.activity import ClassActivity
from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.dispatch.load import LoadEstimator
from scheduler_svc.dispatch.metrics import SchedulerMetrics, backend_series
from scheduler_svc.dispatch.openings import BackendChoice, BackendGates, EnginePriorities
from scheduler_svc.policies import (
    BACKEND_POLICIES,
    BAND_POLICIES,
    BandTurn,
    GateDecision,
    GateInputs,
    LeastLoaded,
    SignalGate,
    StrictRankBands,
)
from scheduler_svc.policies.backend_choice import load_of
from scheduler_svc.policies.band import BandView
from tests.unit.dispatch_harness import CapGate, Harness, never_generates

TOP = PriorityClassConfig(name="interactive", rank=0)
LOW = PriorityClassConfig(name="batch", rank=1, starvation_after_seconds=10.0)
LOWER = PriorityClassConfig(name="bulk", rank=2, starvation_after_seconds=5.0)


@dataclass
class FakeBand:
    priority_class: PriorityClassConfig
    oldest: float

    def oldest_admission(self) -> float:
        return self.oldest


def test_the_registries_know_the_defaults_and_refuse_unknown_names() -> None:
    assert set(BAND_POLICIES.describe()) == {"strict_rank"}
    assert set(BACKEND_POLICIES.describe()) == {"least_loaded", "prefix_locality"}
    with pytest.raises(ConfigError, match="unknown band policy 'nope'"):
        BAND_POLICIES.create("nope")


def test_strict_rank_serves_the_top_band_and_waits_while_its_gate_is_closed() -> None:
    policy = StrictRankBands()
    bands = [FakeBand(TOP, 100.0), FakeBand(LOW, 100.0)]
    turn = policy.choose(bands, 101.0, lambda cls: True)
    assert turn is not None and (turn.index, turn.gate_class) == (0, TOP)
    asked: list[str] = []

    def closed(cls: PriorityClassConfig) -> bool:
        asked.append(cls.name)
        return False

    assert policy.choose(bands, 200.0, closed) is None
    assert asked == ["interactive"]  # only the top band's gate is asked: lower bands wait with it


def test_a_starving_band_gets_every_other_turn_under_the_top_gate() -> None:
    policy = StrictRankBands()
    bands = [FakeBand(TOP, 100.0), FakeBand(LOW, 100.0), FakeBand(LOWER, 100.0)]
    turns = [policy.choose(bands, 106.0, lambda cls: True) for _ in range(4)]
    assert [(t.index, t.gate_class.name) for t in turns if t] == [(2, "interactive"), (0, "interactive")] * 2
    starving_both = [policy.choose(bands, 111.0, lambda cls: True) for _ in range(2)]
    assert [t.index for t in starving_both if t] == [1, 0]  # the better-ranked starving band first


@dataclass
class FakeOpening:
    name: str
    inputs: GateInputs

    @property
    def load(self) -> tuple[int, int, int]:
        return load_of(self.inputs)


def inputs(
    waiting: int, in_flight: int = 0, unstarted: tuple[int, ...] = (), candidate: int | None = None
) -> GateInputs:
    reading = BackendLoad(ok=True, read_at=10.0, waiting=waiting)
    return GateInputs(
        reading=reading,
        now=10.0,
        in_flight=in_flight,
        sent_unseen=0,
        started_since_reading=0,
        unstarted=len(unstarted),
        unstarted_priorities=unstarted,
        candidate_priority=candidate,
    )


def request(user: str = "u") -> QueuedRequest:
    return QueuedRequest("r", "m", user, "interactive", "p", None, SamplingParams(), admitted_at=0.0)


def test_least_loaded_prefers_fewest_ahead_then_queue_then_in_flight_then_config_order() -> None:
    policy = LeastLoaded()
    a, b = FakeOpening("a", inputs(waiting=2)), FakeOpening("b", inputs(waiting=1))
    assert policy.choose(request(), [a, b]) is b
    busy, idle = FakeOpening("busy", inputs(waiting=1, in_flight=5)), FakeOpening("idle", inputs(waiting=1))
    assert policy.choose(request(), [busy, idle]) is idle
    first, second = FakeOpening("first", inputs(waiting=0)), FakeOpening("second", inputs(waiting=0))
    assert policy.choose(request(), [first, second]) is first
    # at a priority engine only what would be served first counts: 2 waiting, none ahead of priority 0
    priority = FakeOpening("priority", inputs(waiting=2, unstarted=(5, 6), candidate=0))
    fifo = FakeOpening("fifo", inputs(waiting=1))
    assert policy.choose(request(), [fifo, priority]) is priority


def gates(priority_scheduling: bool = True, caps: tuple[int, ...] = (1, 1)) -> BackendGates:
    config = config_from_dict(
        {
            "scheduling": {"engine_priority_per_inflight": 3},
            "models": [
                {
                    "name": "m",
                    "backends": [
                        {"name": f"b{i}", "priority_scheduling": priority_scheduling} for i in range(len(caps))
                    ],
                }
            ],
        }
    )
    capabilities = BackendCapabilities(supports_priority=priority_scheduling)
    handles = [
        BackendHandle(b, FakeBackend(never_generates, capabilities=capabilities), CapGate(cap), LoadEstimator())
        for b, cap in zip(config.models[0].backends, caps, strict=True)
    ]
    classes = {c.name: c for c in config.scheduling.classes}
    metrics = SchedulerMetrics()
    series = {h.name: backend_series(metrics, "m", h.name) for h in handles}
    return BackendGates(handles, ClassActivity(config.scheduling.classes), EnginePriorities(classes, 3), series)


def test_engine_priority_grows_with_the_users_requests_at_that_engine() -> None:
    g = gates()
    b0 = g.backends[0]
    b0.estimator.dispatched("r1", user="flood")
    b0.estimator.dispatched("r2", user="flood")
    base = g.priorities.of("batch", None, b0)
    assert base is not None
    assert g.priorities.of("batch", "flood", b0) == base + 6 and g.priorities.of("batch", "late", b0) == base
    plain = gates(priority_scheduling=False)
    plain.backends[0].estimator.dispatched("r1", user="flood")
    assert plain.priorities.of("batch", "flood", plain.backends[0]) is None


def test_open_leaves_out_closed_gates_and_cooling_backends() -> None:
    g = gates(caps=(1, 2))
    b0, b1 = g.backends
    assert [o.name for o in g.open(TOP, TOP, None, 10.0)] == ["b0", "b1"]
    b0.estimator.dispatched("r1", user="u")
    assert [o.name for o in g.open(TOP, TOP, None, 10.0)] == ["b1"]
    b1.cool_until = 12.0
    assert g.open(TOP, TOP, None, 10.0) == []
    states = {(s.name, s.priority_class): s.decision for s in g.states([TOP], 10.0)}
    assert not states[("b1", "interactive")].open and "cooling down 2.0s" in states[("b1", "interactive")].reason


class CountingGate(CapGate):
    """A cap gate that counts the times it is asked and may declare itself reusable (`ReusableGate`)."""

    def __init__(self, cap: int, reusable: bool) -> None:
        super().__init__(cap)
        self.asked = 0
        if reusable:
            self.revision = 0

    def decide(self, inputs: GateInputs, priority_class: PriorityClassConfig) -> GateDecision:
        self.asked += 1
        return super().decide(inputs, priority_class)

    def expires(self, inputs: GateInputs, decision: GateDecision) -> float | None:
        return None


def counting_gates(reusable: bool) -> tuple[BackendGates, list[CountingGate]]:
    g = gates(caps=(5, 5))
    counting = [CountingGate(5, reusable) for _ in g.backends]
    for handle, gate in zip(g.backends, counting, strict=True):
        handle.gate = gate
    return BackendGates(g.backends, ClassActivity([TOP]), g.priorities, g._series), counting


@pytest.mark.parametrize("reusable", [True, False])
def test_a_choice_works_out_each_distinct_answer_once_per_dispatch(reusable: bool) -> None:
    g, counting = counting_gates(reusable)
    choice = BackendChoice(g, TOP, TOP, 10.0)
    assert choice.eligible("a") and choice.eligible("b") and choice.eligible("a")
    assert [gate.asked for gate in counting] == [1, 1]  # b has the same in-flight counts as a: the same answer
    g.backends[0].estimator.dispatched("r", user="c")
    assert choice.eligible("c")  # c has a request at b0: another answer, which b1 (where it has none) gives
    asked_again = [1, 0] if reusable else [1, 1]  # a reusable gate is asked again only where something happened
    assert [gate.asked for gate in counting] == [1 + asked_again[0], 1 + asked_again[1]]
    assert [o.name for o in choice.for_user("c")] == ["b0", "b1"]
    assert g.users_in_flight == {"c": {0: 1}}


def test_kept_answers_are_asked_again_only_after_an_event_at_their_backend() -> None:
    g, counting = counting_gates(reusable=True)
    assert [o.name for o in g.open(TOP, TOP, None, 10.0)] == ["b0", "b1"]
    assert [o.name for o in g.open(TOP, TOP, "u", 11.0)] == ["b0", "b1"]
    assert [gate.asked for gate in counting] == [1, 1], "nothing happened: the answers stand"
    for i in range(5):
        g.backends[1].estimator.dispatched(f"r{i}", user="u")
    assert [o.name for o in g.open(TOP, TOP, None, 12.0)] == ["b0"]
    assert [gate.asked for gate in counting] == [1, 2]
    assert g.open(TOP, TOP, "u", 12.0) == g.open(TOP, TOP, "v", 12.0), "b1 is closed at any priority"
    g.backends[0].cool_until = 14.0
    assert g.open(TOP, TOP, None, 13.0) == []
    assert [o.name for o in g.open(TOP, TOP, None, 14.0)] == ["b0"], "its cooldown is over at its time"
    g.backends[1].estimator.finished("r0", 14.0)
    assert [o.name for o in g.open(TOP, TOP, None, 14.0)] == ["b0", "b1"]


def test_a_kept_answer_on_a_fresh_reading_goes_stale_at_its_time() -> None:
    config = config_from_dict({"models": [{"name": "m", "backends": [{"name": "b0"}]}]})
    model = config.models[0]
    handle = BackendHandle(model.backends[0], FakeBackend(never_generates), SignalGate(model.gate), LoadEstimator())
    classes = config.scheduling.classes
    metrics = SchedulerMetrics()
    g = BackendGates(
        [handle],
        ClassActivity(classes),
        EnginePriorities({c.name: c for c in classes}, 1),
        {"b0": backend_series(metrics, "m", "b0")},
    )
    interactive = classes[0]
    running = model.gate.fallback_max_in_flight  # as many running as a stale reading allows in flight
    for i in range(running):
        handle.estimator.dispatched(f"r{i}")
        handle.estimator.accepted(f"r{i}", 99.0)
        handle.estimator.started(f"r{i}", 99.5)
    handle.record_reading(BackendLoad(ok=True, read_at=100.0, waiting=0, running=running, tpot_seconds=0.01))
    stale_after = model.gate.stale_after_seconds
    assert g.any_open(interactive, interactive, None, 100.0 + stale_after / 2)
    assert g.any_open(interactive, interactive, None, 100.0 + stale_after), "still fresh at its limit"
    assert not g.any_open(interactive, interactive, None, 100.0 + stale_after + 0.001), "stale: the cap holds"


class WorstRankFirst:
    """A band policy for the test: the worst-ranked backlogged band first (the opposite of strict_rank)."""

    def choose(
        self, backlogged: Sequence[BandView], now: float, gate_open: Callable[[PriorityClassConfig], bool]
    ) -> BandTurn:
        return BandTurn(len(backlogged) - 1, backlogged[-1].priority_class)


def test_the_configured_band_policy_is_the_one_the_dispatcher_asks() -> None:
    """scheduling.band_policy picks the registered band policy: with one that serves the worst band first, a
    batch request goes before an interactive one queued earlier; the default serves interactive first."""
    BAND_POLICIES.register("test_worst_rank_first", WorstRankFirst, "the worst-ranked band first (a test)")
    try:
        orders = {}
        for name in ("strict_rank", "test_worst_rank_first"):
            harness = Harness(scheduling={"band_policy": name}, cap=1)
            harness.submit("alice", priority_class="interactive")
            harness.submit("bob", priority_class="batch")
            orders[name] = [t.request.priority_class for t in harness.dispatch()]
    finally:
        BAND_POLICIES._factories.pop("test_worst_rank_first")
        BAND_POLICIES._docs.pop("test_worst_rank_first")
    assert orders == {"strict_rank": ["interactive"], "test_worst_rank_first": ["batch"]}

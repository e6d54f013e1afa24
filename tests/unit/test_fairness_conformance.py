"""Conformance suite every registered fairness policy must pass (the Gateway project's functional tests)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from backends.base import SamplingParams
from scheduler_svc.clock import FakeClock
from scheduler_svc.config import PriorityClassConfig, SchedulingConfig, WeightsConfig
from scheduler_svc.policies import FAIRNESS_POLICIES, FairnessPolicy, WeightResolver
from scheduler_svc.queues import ModelQueues
from scheduler_svc.request import QueuedRequest

POLICIES = sorted(FAIRNESS_POLICIES.describe())


class Harness:
    """A single band driven the way the dispatcher drives it."""

    def __init__(self, policy: FairnessPolicy) -> None:
        self.policy = policy
        self.queues = ModelQueues([PriorityClassConfig()])
        self.band = self.queues.band("interactive")
        self._n = 0

    def add(self, user: str, count: int = 1, max_tokens: int = 16) -> None:
        for _ in range(count):
            self._n += 1
            request = QueuedRequest(
                request_id=f"{user}-{self._n}",
                model="m",
                user=user,
                priority_class="interactive",
                prompt="p",
                messages=None,
                params=SamplingParams(max_tokens=max_tokens),
                admitted_at=float(self._n),
            )
            _, newly = self.queues.push(request)
            if newly:
                self.policy.on_backlogged(user, self.band.flow_views)

    def serve(self) -> QueuedRequest:
        user = self.policy.select(self.band.flow_views)
        assert user in self.band.flows, f"selected {user!r}, which has nothing queued"
        request = self.band.flows[user].head()
        self.queues.remove(request.request_id)
        self.policy.on_dispatched(request)
        self.policy.on_generated(request, request.max_tokens)
        self.policy.on_finished(request, request.max_tokens)
        return request


@pytest.fixture(params=POLICIES)
def harness(request: pytest.FixtureRequest) -> Harness:
    return Harness(FAIRNESS_POLICIES.create(request.param))


def test_only_selects_backlogged_users_and_is_work_conserving(harness: Harness) -> None:
    harness.add("a", 3)
    harness.add("b", 1)
    served = [harness.serve().user for _ in range(4)]
    assert sorted(served) == ["a", "a", "a", "b"]
    assert len(harness.queues) == 0


def test_equal_users_get_equal_service(harness: Harness) -> None:
    for user in "abc":
        harness.add(user, 30)
    served = Counter(harness.serve().user for _ in range(60))
    assert max(served.values()) - min(served.values()) <= 1


def test_latecomer_behind_a_flood_is_served_next_or_after_one(harness: Harness) -> None:
    harness.add("flood", 200)
    for _ in range(5):
        harness.serve()
    harness.add("late")
    order = [harness.serve().user for _ in range(3)]
    assert order.index("late") <= 1


def test_fifo_within_a_user(harness: Harness) -> None:
    harness.add("a", 5)
    harness.add("b", 5)
    served = [harness.serve() for _ in range(10)]
    for user in "ab":
        ids = [r.admitted_at for r in served if r.user == user]
        assert ids == sorted(ids)


def test_a_user_returning_from_idle_rejoins(harness: Harness) -> None:
    harness.add("a", 2)
    harness.serve()
    harness.serve()
    harness.add("b", 3)
    harness.add("a", 1)
    served = [harness.serve().user for _ in range(4)]
    assert served.count("a") == 1 and served.count("b") == 3


def test_a_requeued_request_costs_its_user_nothing(harness: Harness) -> None:
    """Failover: a request dispatched and put back before its first token leaves the counters as they were,
    and its user is served next as if it had never left."""
    harness.add("a", 3)
    harness.add("b", 3)
    harness.serve()
    harness.serve()
    before = harness.policy.counters()
    user = harness.policy.select(harness.band.flow_views)
    request = harness.band.flows[user].head()
    harness.queues.remove(request.request_id)
    harness.policy.on_dispatched(request)
    harness.queues.push(request, front=True)
    harness.policy.on_requeued(request)
    assert harness.policy.counters() == pytest.approx(before)
    assert harness.serve() is request


def _one_off_users(policy: str, users: int, ttl: float, pruning: bool = True) -> tuple[Harness, FakeClock]:
    clock = FakeClock()
    settings = SchedulingConfig(idle_user_ttl_seconds=ttl)
    h = Harness(FAIRNESS_POLICIES.create(policy, WeightResolver(), settings, clock))
    h.policy.pruning = pruning  # type: ignore[attr-defined]
    h.add("steady", 2 * users)  # one user stays backlogged throughout
    for i in range(users):
        h.add(f"one-off-{i}")
        h.serve()
        h.serve()
        clock.advance(1.0)
    return h, clock


@pytest.mark.parametrize("policy", POLICIES)
def test_state_for_4000_one_off_users_stays_bounded(policy: str) -> None:
    """Issue 9 point 7: each policy forgets an idle user once the rules allow; the idle TTL (here 100 s of
    fake time) bounds what the safe rule cannot drop (vtc's length estimates)."""
    h, _ = _one_off_users(policy, 4000, ttl=100.0)
    assert h.policy.tracked_users() <= 110  # type: ignore[attr-defined]
    assert len(h.policy.counters()) <= 110


@pytest.mark.parametrize("policy", POLICIES)
def test_pruning_changes_no_decision(policy: str) -> None:
    """Same seeded workload with pruning on (checked on every event) and off: same dispatch order."""

    def run(pruning: bool) -> list[str]:
        rng = random.Random(7)
        clock = FakeClock()
        h = Harness(
            FAIRNESS_POLICIES.create(policy, WeightResolver(), SchedulingConfig(idle_user_ttl_seconds=0), clock)
        )
        h.policy.pruning = pruning  # type: ignore[attr-defined]
        h.policy.sweep_per_event = 50  # type: ignore[attr-defined]
        order = []
        for _ in range(3000):
            if rng.random() < 0.5:
                h.add(
                    rng.choice(["heavy", "heavy", "mid"] + [f"u{rng.randint(0, 40)}" for _ in range(3)]),
                    rng.randint(1, 3),
                    max_tokens=rng.randint(1, 30),
                )
            if len(h.queues):
                order.append(h.serve().request_id)
            clock.advance(0.1)
        return order

    pruned, kept = run(True), run(False)
    assert pruned == kept


@pytest.mark.parametrize("policy", ["weighted_round_robin", "vtc", "vtc_basic"])
@pytest.mark.parametrize("pause", [50.0, 70.0])
def test_a_heavy_user_pausing_for_less_than_the_ttl_keeps_its_debt(policy: str, pause: float) -> None:
    """A heavy user who goes idle above the floor is not forgotten before the idle TTL (60 s), so pausing
    does not reset its debt; after the TTL it is forgotten."""
    clock = FakeClock()
    weights = WeightResolver(WeightsConfig(users={"light": 20.0}))
    h = Harness(FAIRNESS_POLICIES.create(policy, weights, SchedulingConfig(idle_user_ttl_seconds=60), clock))
    h.add("light", 300, max_tokens=5)
    h.add("heavy", 1, max_tokens=500)
    while "heavy" in h.band.flows:
        h.serve()
    debt = h.policy.counters()["heavy"]
    assert debt > h.policy.counters()["light"]
    for _ in range(10):  # heavy pauses while light is served
        h.serve()
        clock.advance(pause / 10)
    if pause < 60:
        assert h.policy.counters().get("heavy") == debt, "the pause wiped out heavy's debt"
        h.add("heavy", 5, max_tokens=500)
        assert [h.serve().user for _ in range(5)] == ["light"] * 5
    else:
        assert "heavy" not in h.policy.counters()

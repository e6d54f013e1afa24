"""Conformance suite every registered fairness policy must pass (the Gateway project's functional tests)."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_svc.config import PriorityClassConfig, WeightsConfig
from scheduler_svc.core.clock import FakeClock
from scheduler_svc.core.queues import ModelQueues
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.policies import FAIRNESS_POLICIES, Fairness, WeightResolver
from scheduler_svc.policies.cost import LocalCounters, Prices
from scheduler_svc.policies.fairness.activity import UserActivity
from scheduler_svc.policies.fairness.counters import CounterAccount
from scheduler_svc.policies.fairness.turns import TurnAccount
from tests.unit import prompt_share_policy
from tests.unit.queued import queue_request

POLICIES = sorted([*FAIRNESS_POLICIES.describe(), prompt_share_policy.NAME])  # the shipped ones and a test one


@pytest.fixture(autouse=True, scope="module")
def _test_policy() -> Iterator[None]:
    with prompt_share_policy.registered():
        yield


class Harness:
    """A single band driven the way the dispatcher drives it."""

    def __init__(self, policy: Fairness, clock: FakeClock | None = None) -> None:
        self.policy = policy
        self.clock = clock
        self.queues = ModelQueues([PriorityClassConfig()])
        self.band = self.queues.band("interactive")
        self._n = 0

    def add(self, user: str, count: int = 1, max_tokens: int = 16) -> None:
        for _ in range(count):
            self._n += 1
            queue_request(
                self.queues,
                self.policy,
                f"{user}-{self._n}",
                user,
                prompt="p",
                max_tokens=max_tokens,
                admitted_at=float(self._n),
            )

    def serve(self) -> QueuedRequest:
        user = self.policy.select(self.band.flow_views)
        waits = 0
        while user is None and self.clock is not None and waits < 100:  # it waits for users about to return...
            wake = self.policy.wake_at()
            assert wake is not None, "select() returned None with backlogged flows and no time to choose again"
            self.clock.advance(max(0.0, wake - self.clock.now()))  # ...each no longer than it said
            user = self.policy.select(self.band.flow_views)
            waits += 1
        assert user in self.band.flows, f"selected {user!r}, which has nothing queued"
        request = self.band.flows[user].head()
        self.queues.remove(request.request_id)
        self.policy.account.on_dispatched(request)
        self.policy.account.on_generated(request, request.max_tokens)
        self.policy.account.on_finished(request, request.max_tokens)
        return request


@pytest.fixture(params=POLICIES)
def harness(request: pytest.FixtureRequest) -> Harness:
    clock = FakeClock()
    return Harness(FAIRNESS_POLICIES.create(request.param, WeightResolver(), clock), clock)


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
    before = harness.policy.account.counters()
    user = harness.policy.select(harness.band.flow_views)
    assert user is not None
    request = harness.band.flows[user].head()
    harness.queues.remove(request.request_id)
    harness.policy.account.on_dispatched(request)
    harness.queues.push(request, front=True)
    harness.policy.account.on_requeued(request)
    assert harness.policy.account.counters() == pytest.approx(before)
    assert harness.serve() is request


def activity_of(h: Harness) -> UserActivity:
    """The account's record of who is active and when (every account here keeps one)."""
    account = h.policy.account
    assert isinstance(account, CounterAccount | TurnAccount), account
    return account.activity


def _one_off_users(policy: str, users: int, ttl: float, pruning: bool = True) -> tuple[Harness, FakeClock]:
    clock = FakeClock()
    params = {"idle_user_ttl_seconds": ttl}
    h = Harness(FAIRNESS_POLICIES.create(policy, WeightResolver(), clock, params=params), clock)
    activity_of(h).pruning = pruning
    h.add("steady", 2 * users)  # one user stays backlogged throughout
    for i in range(users):
        h.add(f"one-off-{i}")
        h.serve()
        h.serve()
        clock.advance(1.0)
    return h, clock


@pytest.mark.parametrize("policy", POLICIES)
def test_state_for_4000_one_off_users_stays_bounded(policy: str) -> None:
    """Each policy forgets an idle user once the rules allow; the idle TTL (here 100 s of
    fake time) bounds what the safe rule cannot drop (vtc's length estimates)."""
    h, _ = _one_off_users(policy, 4000, ttl=100.0)
    assert h.policy.account.tracked_users() <= 110
    assert len(h.policy.account.counters()) <= 110


@pytest.mark.parametrize("policy", POLICIES)
def test_pruning_changes_no_decision(policy: str) -> None:
    """Same seeded workload with pruning on (checked on every event) and off: same dispatch order."""

    def run(pruning: bool) -> list[str]:
        rng = random.Random(7)
        clock = FakeClock()
        h = Harness(
            FAIRNESS_POLICIES.create(policy, WeightResolver(), clock, params={"idle_user_ttl_seconds": 0}), clock
        )
        activity_of(h).pruning = pruning
        activity_of(h).sweep_per_event = 50
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
    h = Harness(FAIRNESS_POLICIES.create(policy, weights, clock, params={"idle_user_ttl_seconds": 60}), clock)
    h.add("light", 300, max_tokens=5)
    h.add("heavy", 1, max_tokens=500)
    while "heavy" in h.band.flows:
        h.serve()
    debt = h.policy.account.counters()["heavy"]
    assert debt > h.policy.account.counters()["light"]
    for _ in range(10):  # heavy pauses while light is served
        h.serve()
        clock.advance(pause / 10)
    if pause < 60:
        assert h.policy.account.counters().get("heavy") == debt, "the pause wiped out heavy's debt"
        h.add("heavy", 5, max_tokens=500)
        assert [h.serve().user for _ in range(5)] == ["light"] * 5
    else:
        assert "heavy" not in h.policy.account.counters()


BOUNDED = [
    name
    for name in FAIRNESS_POLICIES.describe()
    if FAIRNESS_POLICIES.create(name, WeightResolver(), FakeClock()).guarantee
]


@pytest.mark.parametrize("policy", BOUNDED)
@settings(max_examples=40, deadline=None)
@given(
    slots=st.integers(1, 12),
    lengths=st.tuples(
        st.lists(st.integers(1, 400), min_size=1, max_size=6), st.lists(st.integers(1, 400), min_size=1, max_size=6)
    ),
    prices=st.tuples(st.sampled_from([0.5, 1.0, 3.0]), st.sampled_from([0.5, 1.0, 10.0])),
)
def test_the_stated_service_bound_holds_on_a_multi_slot_engine(
    policy: str, slots: int, lengths: tuple[list[int], list[int]], prices: tuple[float, float]
) -> None:
    """The policy's `service_difference_bound`, on an engine with `slots` slots that each generate one token
    per step: two users always backlogged, each cycling through its own answer lengths; at every step the
    cost served to each differs by no more than the bound."""
    clock = FakeClock()
    p = FAIRNESS_POLICIES.create(policy, WeightResolver(), clock)
    p.account.use_costing(Prices(*prices), LocalCounters(), LocalCounters())
    h = Harness(p)
    cycle = {"a": itertools.cycle(lengths[0]), "b": itertools.cycle(lengths[1])}
    assert p.guarantee is not None
    bound = p.guarantee(slots, max(max(lengths[0]), max(lengths[1])), 1)
    served = {"a": 0.0, "b": 0.0}
    running: dict[str, tuple[QueuedRequest, int]] = {}
    for _ in range(1500):
        while len(running) < slots:
            for user in ("a", "b"):  # two queued before each choice: a flow never empties, so never lifted
                while user not in h.band.flows or len(h.band.flows[user]) < 2:
                    h.add(user, 1, max_tokens=next(cycle[user]))
            chosen = p.select(h.band.flow_views)
            assert chosen is not None
            request = h.band.flows[chosen].head()
            h.queues.remove(request.request_id)
            p.account.on_dispatched(request)
            served[chosen] += prices[0] * request.prompt_tokens_estimate
            running[request.request_id] = (request, 0)
        clock.advance(0.02)
        for rid, (request, done) in list(running.items()):
            p.account.on_generated(request, 1)
            served[request.user] += 2 * prices[1]  # VTC's generated-token weight x the price
            if done + 1 >= request.max_tokens:
                del running[rid]
                p.account.on_finished(request, done + 1)
            else:
                running[rid] = (request, done + 1)
        assert abs(served["a"] - served["b"]) <= bound, (served, bound)


def test_vtc_waits_for_a_user_about_to_return_at_most_the_grace() -> None:
    """A user whose request just ended, who is behind, and who came back within the grace after its previous
    answer (a closed-loop client sends its next request at once) is waited for, so the dispatch its ending
    triggers does not hand the slot to the user ahead; the wait ends at the grace (`wake_at`), and then the
    user ahead goes. A user not seen to return promptly is not waited for, nor one that let the grace pass."""
    clock = FakeClock()
    p = FAIRNESS_POLICIES.create("vtc", WeightResolver(), clock, params={"vtc_return_grace_seconds": 0.05})
    h = Harness(p)
    h.add("ahead", 5, max_tokens=100)
    h.add("behind", 1, max_tokens=10)
    while "behind" in h.band.flows:
        h.serve()
    assert p.select(h.band.flow_views) == "ahead", "waited for a user never seen to return"
    clock.advance(0.01)
    h.add("behind", 1, max_tokens=10)  # back within the grace: from now on it is waited for
    while "behind" in h.band.flows:
        h.serve()
    assert p.select(h.band.flow_views) is None, "did not wait for the user that is behind"
    assert p.wake_at() == pytest.approx(clock.now() + 0.05)
    clock.advance(0.05)
    assert p.select(h.band.flow_views) == "ahead"
    clock.advance(0.01)
    h.add("behind", 1, max_tokens=10)  # after the grace: no longer a prompt returner
    while "behind" in h.band.flows:
        h.serve()
    assert p.select(h.band.flow_views) == "ahead", "waited for a user that let the grace pass"

"""The counter policies' backlog index answers every question as a walk over all backlogged users would, at
every step: through the whole dispatcher (the golden scenarios: priority engines that make users ineligible,
D-LPM windows, weight groups, failovers, expiry) and under seeded random workloads at the account (shared
groups, weights, prices, a spend shared by two models' bands, cancellations the account never hears of,
failovers, the return grace, D-LPM windows with random eligibility)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from scheduler_svc.config import PriorityClassConfig, WeightsConfig
from scheduler_svc.core.clock import FakeClock
from scheduler_svc.core.queues import Flow, ModelQueues
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.policies import FAIRNESS_POLICIES, Fairness, WeightResolver
from scheduler_svc.policies.cost import CounterScope, Prices
from scheduler_svc.policies.fairness.counters import CounterAccount
from tests.golden.record import trace_path, trace_text
from tests.golden.scenarios import SCENARIOS, Scenario
from tests.unit import prompt_share_policy
from tests.unit.checked_order import CheckedOrder, checking
from tests.unit.queued import queue_request

COUNTER_POLICIES = ["test_prompt_share", "vtc", "vtc_basic", "weighted_round_robin"]


@pytest.fixture(autouse=True, scope="module")
def _test_policy() -> Iterator[None]:
    with prompt_share_policy.registered():
        yield


@pytest.mark.parametrize(
    "scenario",
    [s for s in SCENARIOS if s.fairness != "round_robin" and (s.groups or s.locality == "dlpm")],
    ids=lambda s: s.name,
)
def test_the_golden_scenarios_run_on_an_index_that_agrees_with_the_scan_at_every_step(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    with checking(monkeypatch) as orders:
        text = trace_text(scenario)
    assert text == trace_path(scenario).read_text()
    assert sum(o.questions for o in orders) > 200, "the scenario asked the index too little to say anything"


class TwoBands:
    """One priority class on two models, the counters shared (`fairness_scope = "global"`), driven as the
    dispatcher drives a band, with events the account never hears of: a client's cancellation."""

    def __init__(self, policy: str, weights: WeightResolver, rng: random.Random) -> None:
        self.rng = rng
        self.clock = FakeClock()
        scope = CounterScope("global")
        params = {"vtc_return_grace_seconds": 0.3} if policy == "vtc" else {}
        self.policies: list[Fairness] = []
        self.queues: list[ModelQueues] = []
        self.orders: list[CheckedOrder] = []
        for model in ("dear", "cheap"):
            policy_made = FAIRNESS_POLICIES.create(policy, weights, self.clock, params=params)
            order = CheckedOrder()
            account = policy_made.account
            assert isinstance(account, CounterAccount)
            account.use_order(order)
            prices = Prices(3.0, 10.0) if model == "dear" else Prices(0.5, 1.0)
            account.use_costing(prices, scope.counters("interactive", "user"), scope.counters("interactive", "group"))
            self.policies.append(policy_made)
            self.queues.append(ModelQueues([PriorityClassConfig()]))
            self.orders.append(order)
        self.running: list[tuple[int, QueuedRequest, int]] = []  # (band, request, tokens so far)
        self._n = 0

    def flows(self, band: int) -> dict[str, Flow]:
        return self.queues[band].band("interactive").flows

    def add(self, band: int, user: str) -> None:
        self._n += 1
        prompt = "p" * self.rng.randint(1, 400)
        max_tokens = self.rng.randint(1, 60)
        queue_request(
            self.queues[band],
            self.policies[band],
            f"{user}-{self._n}",
            user,
            prompt=prompt,
            max_tokens=max_tokens,
            admitted_at=self.clock.now(),
        )

    def cancel_one(self, band: int) -> None:
        flows = self.flows(band)
        if flows:
            user = self.rng.choice(sorted(flows))
            self.queues[band].remove(flows[user].head().request_id)

    def choose(self, band: int) -> None:
        flows = self.queues[band].band("interactive").flow_views
        if not flows:
            return
        blocked = {u for u in flows if self.rng.random() < 0.3}
        eligible = None if self.rng.random() < 0.3 else (lambda user: user not in blocked)
        policy = self.policies[band]
        if self.rng.random() < 0.5:
            bound = self.rng.choice([0.5, 3.0, 40.0, 900.0])
            users = policy.offer(flows, eligible, bound, self.rng.choice([1, 2, 3, 64]))
            user = self.rng.choice(users) if users else None
        else:
            user = policy.select(flows, eligible)
        if user is None:
            return
        request = flows[user].head()
        self.queues[band].remove(request.request_id)
        policy.account.on_dispatched(request)
        self.running.append((band, request, 0))

    def engine_step(self) -> None:
        for i in self.rng.sample(range(len(self.running)), k=min(3, len(self.running))):
            band, request, done = self.running[i]
            account = self.policies[band].account
            roll = self.rng.random()
            if roll < 0.1 and done == 0:  # failover before the first token
                account.on_requeued(request)
                _, newly = self.queues[band].push(request, front=True)
                if newly:
                    account.on_backlogged(request.user, self.queues[band].band("interactive").flow_views)
                self.running[i] = (-1, request, 0)
            elif roll < 0.4 or done + 5 >= request.max_tokens:
                account.on_generated(request, max(0, request.max_tokens - done))
                account.on_finished(request, request.max_tokens, reached_engine=self.rng.random() < 0.95)
                self.running[i] = (-1, request, 0)
            else:
                account.on_generated(request, 5)
                self.running[i] = (band, request, done + 5)
        self.running = [r for r in self.running if r[0] >= 0]


@pytest.mark.parametrize("policy", COUNTER_POLICIES)
@pytest.mark.parametrize("seed", range(4))
def test_the_index_agrees_with_the_scan_under_random_workloads(policy: str, seed: int) -> None:
    rng = random.Random(seed)
    users = [f"u{i}" for i in range(40)]
    members = {u: f"team-{i % 3}" for i, u in enumerate(users) if i % 2 == 0}  # half in three shared groups
    weights = WeightResolver(
        WeightsConfig(
            users={u: rng.choice([0.5, 1.0, 2.0, 3.0]) for u in rng.sample(users, 12)},
            groups={"team-0": 2.0, "team-1": 0.7},
            members=members,
        )
    )
    h = TwoBands(policy, weights, rng)
    for _ in range(1500):
        band = rng.randrange(2)
        for _ in range(rng.randint(0, 3)):
            hot = users[: rng.choice([3, 40])]  # bursts from a few users, then from anyone
            h.add(rng.randrange(2), rng.choice(hot))
        if rng.random() < 0.1:
            h.cancel_one(band)
        for _ in range(rng.randint(0, 3)):
            h.choose(band)
        h.engine_step()
        h.clock.advance(rng.choice([0.0, 0.01, 0.1, 0.5]))
    asked = sum(o.questions for o in h.orders)
    assert asked > 3000, asked

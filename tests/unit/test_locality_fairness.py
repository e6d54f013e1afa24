"""Conformance of `Fairness.offer` (D-LPM's candidates) for every registered fairness policy.

The bound stated on `counters.LeastServed.offer`: whichever offered user the backend policy sends, two
users backlogged throughout never drift apart by more than `deficit_bound` + the largest single charge.
Hypothesis plays the adversary: it picks which offered user goes at every step.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_svc.config import PriorityClassConfig
from scheduler_svc.core.clock import FakeClock
from scheduler_svc.core.queues import ModelQueues
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.policies import FAIRNESS_POLICIES, Fairness, WeightResolver
from tests.unit import prompt_share_policy
from tests.unit.queued import queue_request

POLICIES = sorted([*FAIRNESS_POLICIES.describe(), prompt_share_policy.NAME])  # the shipped ones and a test one


@pytest.fixture(autouse=True, scope="module")
def _test_policy() -> Iterator[None]:
    with prompt_share_policy.registered():
        yield


COUNTER_POLICIES = [name for name in POLICIES if name != "round_robin"]  # round robin keeps no counters
# The largest single charge in the workloads below, in each policy's counter units.
MAX_PROMPT_CHARS, MAX_TOKENS = 400, 40


def make(name: str) -> Fairness:
    return FAIRNESS_POLICIES.create(name, WeightResolver(), FakeClock())


def max_charge(policy: str) -> float:
    if policy == "weighted_round_robin":
        return 1.0
    return MAX_PROMPT_CHARS / 4 + (0 if policy == prompt_share_policy.NAME else 2 * MAX_TOKENS)


class Band:
    """One band driven the way the dispatcher drives it with `locality.deficit_bound` set."""

    def __init__(self, policy: Fairness) -> None:
        self.policy = policy
        self.queues = ModelQueues([PriorityClassConfig()])
        self.band = self.queues.band("interactive")
        self._n = 0

    def add(self, user: str, prompt_chars: int = 40, max_tokens: int = 8) -> None:
        self._n += 1
        queue_request(
            self.queues,
            self.policy,
            f"{user}-{self._n}",
            user,
            prompt="x" * prompt_chars,
            max_tokens=max_tokens,
            admitted_at=float(self._n),
        )

    def serve(self, user: str) -> QueuedRequest:
        request = self.band.flows[user].head()
        self.queues.remove(request.request_id)
        self.policy.account.on_dispatched(request)
        self.policy.account.on_generated(request, request.max_tokens)
        self.policy.account.on_finished(request, request.max_tokens)
        return request


@pytest.mark.parametrize("name", POLICIES)
def test_offer_with_no_bound_is_select(name: str) -> None:
    """Without a deficit bound the dispatcher's choices are today's, whichever method it calls."""
    selecting, offering = Band(make(name)), Band(make(name))
    for band in (selecting, offering):
        for i in range(30):
            band.add("abc"[i % 3], prompt_chars=40 * (1 + i % 3), max_tokens=1 + 7 * (i % 3))
    served = 0
    for _ in range(30):
        chosen = selecting.policy.select(selecting.band.flow_views)
        offered = offering.policy.offer(offering.band.flow_views, None, 0.0, 64)
        # vtc may hold a choice for a user whose queue just emptied (its return grace): both say so alike
        assert offered == ([] if chosen is None else [chosen])
        if chosen is None:
            assert len(selecting.band.flows) < 3  # the grace holds a choice only once a user's queue ran dry
            break
        selecting.serve(chosen)
        offering.serve(chosen)
        served += 1
    assert served >= 10


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=30, deadline=None)
@given(eligible=st.lists(st.sets(st.sampled_from("abcd")), min_size=5, max_size=20))
def test_offer_puts_selects_choice_first_and_offers_only_eligible_users(name: str, eligible: list[set[str]]) -> None:
    twin, band = Band(make(name)), Band(make(name))
    for b in (twin, band):
        for i in range(40):
            b.add("abcd"[i % 4], prompt_chars=40 + 10 * (i % 4))
    for allowed in eligible:
        chosen = twin.policy.select(twin.band.flow_views, allowed.__contains__)
        offered = band.policy.offer(band.band.flow_views, allowed.__contains__, 1e9, 10_000)
        if chosen is None:
            assert offered == []
            continue
        assert offered[0] == chosen and set(offered) <= allowed and len(set(offered)) == len(offered)
        if name != "round_robin":
            assert set(offered) == allowed & set(band.band.flows)  # an unbounded deficit offers everyone
        twin.serve(chosen)
        band.serve(chosen)


@pytest.mark.parametrize("name", COUNTER_POLICIES)
@settings(max_examples=40, deadline=None)
@given(
    bound=st.sampled_from([0.0, 1.0, 50.0, 300.0]),
    limit=st.sampled_from([2, 3, 10_000]),
    sizes=st.lists(st.tuples(st.integers(1, MAX_PROMPT_CHARS), st.integers(1, MAX_TOKENS)), min_size=4, max_size=4),
    picks=st.lists(st.integers(0, 3), min_size=40, max_size=120),
)
def test_any_choice_among_the_offered_keeps_counters_within_the_bound(
    name: str, bound: float, limit: int, sizes: list[tuple[int, int]], picks: list[int]
) -> None:
    band = Band(make(name))
    users = "abcd"
    for user, (chars, tokens) in zip(users, sizes, strict=True):
        for _ in range(3):
            band.add(user, chars, tokens)
    spread_bound = bound + max_charge(name)
    for pick in picks:
        offered = band.policy.offer(band.band.flow_views, None, bound, limit)
        assert len(offered) <= limit
        user = offered[pick % len(offered)]  # the adversary: any offered user may be sent
        request = band.serve(user)
        band.add(user, len(request.prompt or ""), request.max_tokens)  # everyone stays backlogged
        counters = band.policy.account.counters()
        keys = [counters.get(u, 0.0) for u in users]  # a user never charged has no entry yet
        spread = max(keys) - min(keys)
        assert spread <= spread_bound + 1e-9, f"{name}: spread {spread} over bound {bound} + one charge"


@pytest.mark.parametrize("name", COUNTER_POLICIES)
def test_offer_weighs_at_most_the_limit_the_least_served_first(name: str) -> None:
    """With more users within the bound than the limit, the offer holds `limit` of them: the policy's choice
    and then the least served, in backlog order (so a decision costs the same with thousands in the window)."""
    band = Band(make(name))
    users = [f"u{i:03d}" for i in range(120)]
    for user in users:
        band.add(user)
        band.add(user)
    for user in users[::3]:  # a third of them served once: ahead of the others
        band.serve(user)
    counters = band.policy.account.counters()
    limit = 9
    offered = band.policy.offer(band.band.flow_views, None, 1e9, limit)
    everyone = band.policy.offer(band.band.flow_views, None, 1e9, 10_000)
    assert len(everyone) == len(users) and len(offered) == limit
    assert offered[0] == everyone[0]
    others = offered[1:]
    assert others == [u for u in everyone if u in set(others)], "not in backlog order"
    left_out = set(everyone) - set(offered)
    assert max(counters.get(u, 0.0) for u in others) <= min(counters.get(u, 0.0) for u in left_out)

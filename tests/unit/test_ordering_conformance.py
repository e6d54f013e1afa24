"""Conformance suite every registered ordering policy must pass (like the fairness one).

The contract: a user's flow holds its queued requests in the policy's order (its key, ties in arrival
order), except that a request put back after a failed dispatch goes first (the latest put back first);
the head is the next to go; positions are the ranks in that same order, a permutation of 1..n; cancelling
any request keeps all of this; the flow's oldest admission does not depend on the order.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.base import SamplingParams
from scheduler_svc.config import PriorityClassConfig
from scheduler_svc.core.queues import Flow, ModelQueues
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.policies import ORDERING_POLICIES, OrderingPolicy

POLICIES = sorted(ORDERING_POLICIES.describe())


def request(n: int, admitted_at: float, deadline: float | None = None, user: str = "alice") -> QueuedRequest:
    return QueuedRequest(
        request_id=f"r{n}",
        model="m",
        user=user,
        priority_class="interactive",
        prompt="p",
        messages=None,
        params=SamplingParams(max_tokens=4),
        admitted_at=admitted_at,
        deadline=deadline,
    )


class Reference:
    """What the contract says the flow must hold, kept the obvious way (lists, sorted on every look)."""

    def __init__(self, policy: OrderingPolicy) -> None:
        self.policy = policy
        self.fronts: list[QueuedRequest] = []  # put back, latest first
        self.rest: list[tuple[int, QueuedRequest]] = []  # (arrival index, request)
        self._arrivals = itertools.count()

    def push(self, r: QueuedRequest) -> None:
        self.rest.append((next(self._arrivals), r))

    def push_front(self, r: QueuedRequest) -> None:
        self.fronts.insert(0, r)

    def remove(self, r: QueuedRequest) -> None:
        self.fronts = [x for x in self.fronts if x is not r]
        self.rest = [(i, x) for i, x in self.rest if x is not r]

    def order(self) -> list[QueuedRequest]:
        rest = sorted(self.rest, key=lambda e: (self.policy.key(e[1]), e[0]))
        return self.fronts + [r for _, r in rest]


def check(flow: Flow, reference: Reference) -> None:
    """Every invariant of the contract, on the flow as it is now."""
    order = list(flow)
    assert order == reference.order()
    assert len(flow) == len(order)
    assert [flow.position(r) for r in order] == list(range(1, len(order) + 1))
    if order:
        assert flow.head() is order[0]
        assert flow.is_last(order[-1])
        assert flow.oldest_admission() == min(r.admitted_at for r in order)


@pytest.fixture(params=POLICIES)
def policy(request: pytest.FixtureRequest) -> OrderingPolicy:
    return ORDERING_POLICIES.create(request.param)


def test_select_takes_only_queued_requests_in_position_order(policy: OrderingPolicy) -> None:
    flow = Flow("alice", "interactive", policy.key)
    deadlines = [30.0, None, 10.0, 20.0, None, 10.0, 5.0]
    queued = [request(i, float(i), d) for i, d in enumerate(deadlines)]
    for r in queued:
        flow.push(r)
    by_position = sorted(queued, key=flow.position)
    assert [flow.position(r) for r in by_position] == list(range(1, len(queued) + 1))
    selected = []
    while len(flow):
        head = flow.head()
        assert head in queued and head not in selected and flow.position(head) == 1
        selected.append(flow.remove(head.request_id))
        assert flow.position(head) == 0
    assert selected == by_position


def test_cancelling_any_request_keeps_positions_a_permutation(policy: OrderingPolicy) -> None:
    flow, reference = Flow("alice", "interactive", policy.key), Reference(policy)
    queued = [request(i, float(i), [None, 50.0, 20.0][i % 3]) for i in range(12)]
    for r in queued:
        flow.push(r)
        reference.push(r)
    for r in (queued[5], queued[0], queued[11], queued[7]):  # middle, first, last, middle
        assert flow.remove(r.request_id) is r
        reference.remove(r)
        check(flow, reference)
    assert flow.remove(queued[5].request_id) is None  # a second cancel of the same request is a no-op


def test_a_request_put_back_goes_first_whatever_its_key(policy: OrderingPolicy) -> None:
    queues = ModelQueues([PriorityClassConfig()], policy.key)
    queued = [request(i, float(i), 100.0 - i) for i in range(4)]  # later arrivals have closer deadlines
    for r in queued:
        queues.push(r)
    flow = queues.flow_of("r0")
    assert flow is not None
    first = flow.head()
    queues.remove(first.request_id)  # dispatched
    queues.push(first, front=True)  # failed before its first token
    assert flow.head() is first and flow.position(first) == 1
    second = list(flow)[1]
    queues.remove(first.request_id)
    queues.remove(second.request_id)
    queues.push(first, front=True)  # both failed, `second` last: it goes first, then `first`
    queues.push(second, front=True)
    assert list(flow)[:2] == [second, first]
    assert sorted(flow.position(r) for r in queued) == [1, 2, 3, 4]


def test_a_request_put_back_into_an_empty_queue_stays_ahead_of_newcomers(policy: OrderingPolicy) -> None:
    queues = ModelQueues([PriorityClassConfig()], policy.key)
    back = request(0, 0.0, None)
    queues.push(back, front=True)
    newcomer = request(1, 1.0, 2.0)  # closer deadline than the one put back (which has none)
    queues.push(newcomer)
    flow = queues.flow_of("r0")
    assert flow is not None and list(flow) == [back, newcomer]


def test_the_oldest_admission_does_not_depend_on_the_order(policy: OrderingPolicy) -> None:
    flow = Flow("alice", "interactive", policy.key)
    old = request(0, 1.0, None)  # no deadline: last under edf
    flow.push(old)
    for i in range(1, 5):
        flow.push(request(i, 1.0 + i, 10.0 + i))
    assert flow.oldest_admission() == 1.0
    flow.remove(old.request_id)
    assert flow.oldest_admission() == 2.0


def test_flows_of_thousands_stay_consistent_and_compact(policy: OrderingPolicy) -> None:
    """Many cancels that never touch the oldest request: positions stay exact and the admission record does
    not grow with the number of pushes (it is rebuilt once stale entries dominate)."""
    flow, reference = Flow("alice", "interactive", policy.key), Reference(policy)
    oldest = request(-1, 0.0, None)
    flow.push(oldest)
    reference.push(oldest)
    for i in range(3000):
        r = request(i, 1.0 + i, float(i % 97))
        flow.push(r)
        if i % 3:
            flow.remove(r.request_id)  # cancelled
        else:
            reference.push(r)
    check(flow, reference)
    assert len(flow._admissions) <= 2 * len(flow) + 16


_ops = st.lists(
    st.tuples(
        st.sampled_from(["push", "push", "push", "front", "remove", "select"]),
        st.one_of(st.none(), st.integers(0, 5).map(float)),  # deadline (few values: many ties)
        st.integers(0, 1000),  # which queued request to remove
    ),
    max_size=60,
)


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=150, deadline=None)
@given(ops=_ops)
def test_any_sequence_of_push_remove_and_select_keeps_the_contract(
    name: str, ops: list[tuple[str, float | None, int]]
) -> None:
    policy = ORDERING_POLICIES.create(name)
    queues = ModelQueues([PriorityClassConfig()], policy.key)
    reference = Reference(policy)
    dispatched: list[QueuedRequest] = []  # taken out by select: may be put back with push_front
    n = 0
    for op, deadline, pick in ops:
        flow = queues.band("interactive").flows.get("alice")
        queued = list(flow) if flow is not None else []
        if op == "push":
            n += 1
            r = request(n, float(n), deadline)
            queues.push(r)
            reference.push(r)
        elif op == "front" and dispatched:
            r = dispatched.pop(pick % len(dispatched))
            queues.push(r, front=True)
            reference.push_front(r)
        elif op == "remove" and queued:
            r = queued[pick % len(queued)]
            assert queues.remove(r.request_id) is r
            reference.remove(r)
        elif op == "select" and flow is not None:
            head = flow.head()
            assert head in queued and flow.position(head) == 1
            assert queues.remove(head.request_id) is head
            reference.remove(head)
            dispatched.append(head)
        flow = queues.band("interactive").flows.get("alice")
        if flow is None:
            assert reference.order() == [] and len(queues) == 0
        else:
            check(flow, reference)
            assert len(queues) == len(flow)


@pytest.mark.parametrize("seed", range(3))
def test_a_bands_oldest_admission_is_the_least_of_its_flows_as_requests_come_and_go(
    policy: OrderingPolicy, seed: int
) -> None:
    """The band reads its oldest admission from a heap of its flows (not a look at every flow): after every
    push, push back at the front and removal it equals the least over the flows, and the heap stays compact."""
    rng = random.Random(seed)
    queues = ModelQueues([PriorityClassConfig()], policy.key)
    band = queues.band("interactive")
    queued: list[QueuedRequest] = []
    for n in range(4000):
        roll = rng.random()
        if roll < 0.5 or not queued:
            deadline = rng.choice([None, 50.0 + rng.random()])
            r = request(n, rng.uniform(0, 100), deadline, user=f"u{rng.randrange(60)}")
            queues.push(r, front=rng.random() < 0.1)
            queued.append(r)
        else:
            gone = queued.pop(rng.randrange(len(queued)))
            queues.remove(gone.request_id)
        if band.size:
            assert band.oldest_admission() == min(f.oldest_admission() for f in band.flows.values())
    assert len(band._oldest) <= 2 * len(band.flows) + 16

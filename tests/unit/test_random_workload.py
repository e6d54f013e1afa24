"""Seeded random workloads through the dispatcher, checking invariants after every step.

Invariants: no request lost or dispatched twice; queue, running set and ledger agree with the tickets;
exactly one outcome each; FIFO within a user's class; no backlogged user of the served band is skipped
more often than its weight allows; everything drains once submissions stop.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections import defaultdict
from collections.abc import Iterator

import pytest

from scheduler_svc.core.errors import QueueFull
from scheduler_svc.core.ticket import Outcome, TicketState
from scheduler_svc.policies import FAIRNESS_POLICIES
from tests.unit import prompt_share_policy
from tests.unit.dispatch_harness import Harness

POLICIES = sorted([*FAIRNESS_POLICIES.describe(), prompt_share_policy.NAME])  # the shipped ones and a test one


@pytest.fixture(autouse=True, scope="module")
def _test_policy() -> Iterator[None]:
    with prompt_share_policy.registered():
        yield


def check_invariants(h: Harness, with_metrics: bool = False) -> None:
    states = defaultdict(list)
    for ticket in h.tickets.values():
        states[ticket.state].append(ticket)
    assert h.queued() == len(states[TicketState.QUEUED])
    for ticket in states[TicketState.QUEUED]:
        assert ticket.position() > 0
        assert ticket.outcome is None and ticket.backend is None
    assert h.handle.estimator.in_flight == len(states[TicketState.DISPATCHED])
    assert all(t.outcome is not None for t in states[TicketState.DONE])
    if with_metrics:  # collecting the registry is slow: every so often
        sample = h.metrics.registry.get_sample_value
        labels = ({"model": "m", "outcome": o.value} for o in Outcome)
        recorded = sum(sample("llmsched_request_outcomes_total", label) or 0 for label in labels)
        assert recorded == len(states[TicketState.DONE])
    ids = [t.request.request_id for t in h.dispatch_log]
    assert len(ids) == len(set(ids)), "a request was dispatched twice"
    assert all(h.tickets[i].backend is not None for i in ids)


def check_fifo(h: Harness) -> None:
    last: dict[tuple[str, str], int] = {}
    for ticket in h.dispatch_log:
        key = (ticket.request.user, ticket.request.priority_class)
        submitted = int(ticket.request.request_id.rsplit("-", 1)[1])  # the harness numbers submissions
        assert submitted > last.get(key, -1), f"FIFO broken for {key}"
        last[key] = submitted


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(4))
def test_random_workload_keeps_every_invariant(policy: str, seed: int) -> None:
    rng = random.Random(seed * 1000 + len(policy))
    users = [f"u{i}" for i in range(rng.randint(2, 6))]
    weights = {u: float(rng.choice([1, 2, 4])) for u in users}
    classes = [
        {"name": "interactive", "rank": 0, "queue_ttl_seconds": rng.choice([0.0, 3.0])},
        {"name": "batch", "rank": 1, "starvation_after_seconds": 2.0},
    ]
    h = Harness(
        {"fairness": policy, "weights": {"users": weights}, "classes": classes, "default_class": "interactive"},
        model={"max_queued_per_user": 30, "max_queued": 100},
        cap=rng.randint(1, 6),
    )
    skipped: dict[str, int] = defaultdict(int)  # band dispatches a backlogged interactive user sat out
    worst_skip: dict[str, int] = defaultdict(int)
    for step in range(800):
        roll = rng.random()
        if roll < 0.45:
            with contextlib.suppress(QueueFull):
                user, cls = rng.choice(users), rng.choice(["", "", "batch"])
                h.submit(user, max_tokens=rng.randint(1, 20), priority_class=cls)
        elif roll < 0.52 and h.tickets:
            rng.choice(list(h.tickets.values())).close(Outcome.CANCELLED)  # a client hangs up, any state
        h.dispatch()
        h.step(rng.choice([0.01, 0.05, 0.2]))
        check_invariants(h, with_metrics=step % 100 == 0)
    check_fifo(h)
    for ticket, others in h.assignments:  # replay who sat out each interactive dispatch while backlogged
        if ticket.request.priority_class != "interactive":
            continue
        for user in list(skipped):
            if user not in others:
                skipped[user] = 0  # it was not backlogged: the count starts again
        skipped[ticket.request.user] = 0
        for user in others - {ticket.request.user}:
            skipped[user] += 1
            worst_skip[user] = max(worst_skip[user], skipped[user])

    # No starvation. Round robin: one turn of each other user. Weighted: the user's share of dispatches
    # (total weight / own weight), up to 3x because users returning from idle are lifted only to the
    # smallest counter (VTC's rule) and may go first; token policies also by the spread of request sizes.
    total_weight = sum(weights.values())
    size_ratio = 20 if policy.startswith("vtc") else 1
    for user, worst in worst_skip.items():
        if policy == "round_robin":
            bound = len(users) - 1
        else:
            bound = 3 * math.ceil(total_weight / weights[user]) * size_ratio + len(users)
        assert worst <= bound, f"{user} (weight {weights[user]}) skipped {worst} times in a row, bound {bound}"

    for _ in range(10000):  # stop submitting: everything must drain
        if not any(t.state is not TicketState.DONE for t in h.tickets.values()):
            break
        h.dispatch()
        h.step(0.05)
        check_invariants(h)
    check_invariants(h, with_metrics=True)
    assert all(t.state is TicketState.DONE for t in h.tickets.values()), "requests were lost"

"""End users inside a tenant's share (`dispatch.end_users`): a tenant whose one end user floods delays its
other end users by at most one of the flood's requests and leaves the other tenants' shares as they were;
the nested policies live only while their tenant is active; the cap on end users, the ids' form, and the
cluster's message carry it. Fake clock, the real dispatcher."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client import generate_latest

from backends.base import SamplingParams
from backends.errors import BackendUnavailable
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.cluster.messages import Admit, decode, encode
from scheduler_svc.config import PriorityClassConfig
from scheduler_svc.core.admission import build_request
from scheduler_svc.core.clock import FakeClock
from scheduler_svc.core.errors import InvalidField, QueueFull
from scheduler_svc.core.request import ClientRequest, QueuedRequest
from scheduler_svc.core.ticket import Outcome, Ticket
from scheduler_svc.dispatch.end_users import NESTED_PARAMS, EndUserShares
from scheduler_svc.dispatch.queue_book import QueueBook
from scheduler_svc.policies import FAIRNESS_POLICIES, Fairness
from scheduler_svc.policies.ordering import FcfsOrdering
from scheduler_svc.policies.weights import WeightResolver
from tests.golden.scenarios import FAIRNESS
from tests.unit.dispatch_harness import Harness

TOKENS = 10  # every request's answer: one decode of a request is TOKENS steps
FLOOD = 30  # the flooding end user's requests, and each other tenant's
SIBLINGS_AT = 20  # the step at which the tenant's two other end users send one request each
STEPS = 400


@dataclass(frozen=True)
class Sibling:
    """One of the tenant's other end users' requests: its wait, and the flood's requests that went first."""

    wait_steps: int
    flood_ahead: int


@dataclass(frozen=True)
class FloodRun:
    siblings: dict[str, Sibling]
    others: list[tuple[int, str]]  # (step, tenant) of each dispatch to the other tenants, in order
    shares: dict[str, int]  # dispatches per tenant in the first 150 steps (everyone backlogged)


def flood_behind_one_caller(policy: str, acme: str) -> FloodRun:
    """Tenants acme, t2 and t3 on a 4-slot engine, t2 and t3 flooding from step 0. `acme`: "named" (its end
    user `flood` floods, then `bob` and `carol` each send one), "unnamed" (the same requests naming no end
    user: today's single queue), or "no flood" (only bob's and carol's)."""
    h = Harness({"fairness": policy}, cap=4)
    if acme != "no flood":
        for _ in range(FLOOD):
            h.submit("acme", TOKENS, end_user="flood" if acme == "named" else "")
    for tenant in ("t2", "t3"):
        for _ in range(FLOOD):
            h.submit(tenant, TOKENS)
    order: list[tuple[int, Ticket]] = []
    arrivals: dict[str, tuple[Ticket, int, int]] = {}
    for step in range(STEPS):
        if step == SIBLINGS_AT:
            for end_user in ("bob", "carol"):
                ticket = h.submit("acme", TOKENS, end_user="" if acme == "unnamed" else end_user)
                arrivals[end_user] = (ticket, step, len(order))
        order.extend((step, ticket) for ticket in h.dispatch())
        h.step()
    siblings = {}
    for end_user, (ticket, step, before) in arrivals.items():
        at = next(i for i, (_, t) in enumerate(order) if t is ticket)
        flood = sum(1 for _, t in order[before:at] if t.request.user == "acme" and t not in _tickets(arrivals))
        siblings[end_user] = Sibling(order[at][0] - step, flood)
    others = [(step, t.request.user) for step, t in order if t.request.user != "acme"]
    window = [t.request.user for step, t in order if step < 150]
    return FloodRun(siblings, others, {tenant: window.count(tenant) for tenant in ("acme", "t2", "t3")})


def _tickets(arrivals: dict[str, tuple[Ticket, int, int]]) -> list[Ticket]:
    return [ticket for ticket, _, _ in arrivals.values()]


@pytest.mark.parametrize("policy", FAIRNESS)
def test_a_flooding_end_user_delays_its_siblings_by_one_decode_and_leaves_the_other_tenants_shares(
    policy: str,
) -> None:
    named = flood_behind_one_caller(policy, "named")
    unnamed = flood_behind_one_caller(policy, "unnamed")
    no_flood = flood_behind_one_caller(policy, "no flood")
    for end_user, sibling in named.siblings.items():
        assert sibling.flood_ahead <= 1, (end_user, sibling)
        # beyond the wait it would have had with no flood at all: at most one decode of the flood's request
        assert sibling.wait_steps <= no_flood.siblings[end_user].wait_steps + TOKENS, (end_user, sibling)
    # without end users the same requests wait behind the whole flood (what the nesting changes)
    assert all(s.flood_ahead >= FLOOD - 5 for s in unnamed.siblings.values()), unnamed.siblings
    # the other tenants see acme as before: the same dispatches at the same steps, whoever acme serves
    assert named.others == unnamed.others
    assert named.shares == unnamed.shares


def test_a_tenants_nested_policy_lives_while_the_tenant_is_active_and_costs_nothing_without_end_users() -> None:
    clock = FakeClock()

    def build() -> Fairness:
        return FAIRNESS_POLICIES.create("vtc", WeightResolver(), clock, params=NESTED_PARAMS)

    shares = EndUserShares(build)
    book = QueueBook([PriorityClassConfig()], FcfsOrdering().key, end_users=shares)
    plain = _ticket("p0", end_user="")
    book.put(plain)
    assert len(shares) == 0  # a tenant naming no end user has none
    named = [_ticket(f"n{i}", end_user=e) for i, e in enumerate(("bob", "bob", "carol"))]
    for ticket in named:
        book.put(ticket)
    assert len(shares) == 1
    flow = book.band("interactive").flows["acme"]
    assert list(flow.end_user_flows) == ["", "bob", "carol"] and [len(f) for f in flow.end_user_flows.values()] == [
        1,
        2,
        1,
    ]
    assert book.position(named[1]) == 2 and book.position(named[2]) == 1  # ranks among the end user's own
    book.take(plain, dispatched=True)
    shares.dispatched(plain.request)  # the nested policy counts it for the tenant's requests naming none
    for ticket in named:
        book.take(ticket)  # cancelled
    assert len(shares) == 1  # nothing queued, but a request it saw dispatched still runs
    shares.finished(plain.request, 3, reached_engine=True)
    assert len(shares) == 0  # nothing queued, nothing running: forgotten
    early = _ticket("p1", end_user="")
    book.put(early)
    book.take(early, dispatched=True)
    shares.dispatched(early.request)  # dispatched while the tenant had no nested policy: never heard of
    late = _ticket("n9", end_user="bob")
    book.put(late)
    assert len(shares) == 1
    book.take(late, dispatched=True)
    shares.dispatched(late.request)
    shares.finished(early.request, 3, reached_engine=True)
    assert len(shares) == 1  # bob's runs
    shares.finished(late.request, 3, reached_engine=True)
    assert len(shares) == 0


def _ticket(rid: str, end_user: str, user: str = "acme") -> Ticket:
    request = QueuedRequest(rid, "m", user, "interactive", "p", None, SamplingParams(), 0.0, end_user=end_user)

    class Host:
        def now(self) -> float:
            return 0.0

        def position(self, ticket: Ticket) -> int:
            return 0

        def expire(self, ticket: Ticket) -> None: ...

        def release(self, ticket: Ticket, outcome: Outcome) -> None: ...

        def settled(self, ticket: Ticket) -> None: ...

    return Ticket(request, Host())


def test_an_end_users_request_that_fails_over_goes_first_again_for_its_end_user() -> None:
    h = Harness({"fairness": "round_robin"}, cap=1)
    first = h.submit("acme", TOKENS, end_user="bob")
    (sent,) = h.dispatch()
    assert sent is first
    queued = [h.submit("acme", TOKENS, end_user=e) for e in ("bob", "carol", "bob")]
    h.clock.advance(0.01)
    assert h.events.fail_over(first, BackendUnavailable("connection refused"))
    h.clock.advance(5.0)  # past the failed backend's cool-down
    order: list[str] = []
    for _ in range(40):
        order.extend(t.request.request_id for t in h.dispatch())
        h.step()
    assert order[0] == first.request.request_id  # back at the head of bob's queue, and bob's turn given back
    assert order[1:] == [queued[1].request.request_id, queued[0].request.request_id, queued[2].request.request_id]


def test_the_end_users_a_tenant_holds_are_capped_and_free_again_as_their_requests_end() -> None:
    h = Harness(model={"max_end_users_per_user": 2}, cap=1)
    a = h.submit("acme", 2, end_user="a")
    h.submit("acme", 2, end_user="b")
    h.submit("acme", 2, end_user="b")
    h.submit("acme", 2)  # naming no end user: never counted
    with pytest.raises(QueueFull, match=r"user acme has requests of 2 end users .*max_end_users_per_user") as full:
        h.submit("acme", 2, end_user="c")
    assert full.value.retry_after_seconds >= 1.0
    h.submit("other", 2, end_user="c")  # another tenant's end users are its own
    while a.outcome is None:
        h.dispatch()
        h.step()
    h.submit("acme", 2, end_user="c")  # a's only request ended: room for one more


def test_end_user_ids_have_the_form_of_user_ids_and_are_never_a_metric_label() -> None:
    config = config_from_dict({"models": [{"name": "m", "backends": [{"name": "b0"}]}]})
    for bad in (" bob", "bob smith", "-bob", "b" * 129, "bö"):
        with pytest.raises(InvalidField) as err:
            build_request(ClientRequest("m", "hi", end_user=bad), user="acme", config=config, now=0.0, timeout=None)
        assert err.value.param == "end_user"
    request = build_request(
        ClientRequest("m", "hi", end_user="user-7@example.com"), user="acme", config=config, now=0.0, timeout=None
    )
    assert request.end_user == "user-7@example.com"
    h = Harness(cap=2)
    for i in range(4):
        h.submit("acme", 2, end_user=f"secret-end-user-{i}")
    for _ in range(10):
        h.dispatch()
        h.step()
    assert "secret-end-user" not in generate_latest(h.metrics.registry).decode()


def test_a_followers_admit_carries_the_end_user_to_the_leader() -> None:
    admit = Admit("r1", "id~1", "m", "acme", "interactive", "", "text", 4, 4, 8, 0.0, None, "", end_user="bob")
    decoded = decode(encode(admit))
    assert isinstance(decoded, Admit) and decoded.end_user == "bob"
    older = encode(Admit("r1", "id~2", "m", "acme", "interactive", "", "text", 4, 4, 8, 0.0, None, ""))
    assert b"end_user" in older
    from_older = decode(older.replace(b',"end_user":""', b""))
    assert isinstance(from_older, Admit) and from_older.end_user == ""

"""End users inside a tenant's share: each tenant's end users served fairly among themselves, by the band's
own fairness policy.

The caller's identity is the tenant: the band's fairness policy chooses among tenants (weights, caps and
keys are the tenant's, as ever). A request may name an end user (the OpenAI `user` field, or
`x-end-user-id`); it then waits in its end user's queue inside the tenant's flow (`core.queues.Flow`), and
when the tenant's turn comes, which end user's request goes is chosen by a second instance of the same
policy, nested: one per tenant and class, over that tenant's end users, all of weight 1 (the tenant's
requests that name no end user are one more end user, of the empty id). So a flooding end user gets its
share of its tenant's share and no more, and the other tenants see the tenant exactly as before: the band's
policy hears the same events whatever the tenant's end users are.

Lifetime: a tenant's nested policy is made when its first request naming an end user is queued in the class
(the tenant's end users with queued requests, the empty one included, are announced to it then), and is
dropped once the tenant has nothing queued in the class and nothing it saw dispatched still runs; in
between it forgets idle end users by its own rules (`policies.fairness.activity`). It hears only of
requests dispatched while it exists. A tenant that names no end user never has one: its requests cost
nothing more than before.

A choice within a tenant never waits for a returning end user (vtc's return grace is 0 here): the band has
chosen the tenant already, and holding that choice would hold the band.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from scheduler_svc.core.queues import Flow
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.policies import Fairness
from scheduler_svc.policies.cost import Counters, LocalCounters, Prices

NESTED_PARAMS = {"vtc_return_grace_seconds": 0.0}
"""Parameters the nested policies take in place of the band's (see the module docstring)."""


def as_end_user(request: QueuedRequest) -> QueuedRequest:
    """A tenant's request as its nested policy sees it: the same request with its end user in place of its
    user (a copy: the queued request itself is left as it is)."""
    return replace(request, user=request.end_user)


@dataclass(eq=False)
class _Nested:
    """One tenant's nested policy in one class: what it needs to hear, and when it may go."""

    fairness: Fairness
    counters: tuple[Counters, Counters]  # its own (end user, group) counters, kept across a change of prices
    flow: Flow  # the tenant's flow in the class (a new one each time the tenant becomes backlogged)
    running: dict[str, QueuedRequest]  # request id -> the requests it saw dispatched (`as_end_user`), still running


class EndUserShares:
    """One model's nested fairness policies, one per (class, tenant) that names end users.

    `build` makes a fresh policy of the band's kind (None: end users are not told apart, every request goes
    in its tenant's order). The queue book asks `choose` for a tenant's next end user and reports what is
    queued and what leaves; the handover reports dispatches, and the request events what runs."""

    def __init__(self, build: Callable[[], Fairness] | None = None, prices: Prices | None = None) -> None:
        self._build = build
        self._prices = prices or Prices()
        self._nested: dict[tuple[str, str], _Nested] = {}

    def __len__(self) -> int:
        """How many tenants' nested policies are kept (all classes)."""
        return len(self._nested)

    def use_prices(self, prices: Prices) -> None:
        """The model's prices from a reloaded configuration: every nested policy charges at them from now on."""
        self._prices = prices
        for nested in self._nested.values():
            nested.fairness.account.use_costing(prices, *nested.counters)

    # -- the choice (`core.queues.EndUserChoice`) ------------------------------------------------------------
    def choose(self, flow: Flow) -> str:
        """Which of the tenant's backlogged end users goes next, by its nested policy."""
        subflows = flow.end_user_flows
        nested = self._nested.get((flow.priority_class, flow.user))
        chosen = None if nested is None else nested.fairness.select(subflows)
        return chosen if chosen is not None else next(iter(subflows))

    # -- what the queue book reports -------------------------------------------------------------------------
    def queued(self, request: QueuedRequest, flow: Flow) -> None:
        """`request` was put in `flow` (admitted, or back after a failover)."""
        key = (request.priority_class, request.user)
        nested = self._nested.get(key)
        subflows = flow.end_user_flows
        if nested is None:
            if not request.end_user or self._build is None:
                return
            fairness = self._build()
            counters: tuple[Counters, Counters] = (LocalCounters(), LocalCounters())
            fairness.account.use_costing(self._prices, *counters)
            self._nested[key] = _Nested(fairness, counters, flow, {})
            for end_user in subflows:
                fairness.account.on_backlogged(end_user, subflows)
            return
        nested.flow = flow
        if len(subflows[request.end_user]) == 1:
            nested.fairness.account.on_backlogged(request.end_user, subflows)

    def left(self, request: QueuedRequest) -> None:
        """A queued request left its queue without being dispatched (cancelled, expired, shut down)."""
        key = (request.priority_class, request.user)
        if (nested := self._nested.get(key)) is not None:
            self._drop_if_idle(key, nested)

    # -- what runs -----------------------------------------------------------------------------------------
    def dispatched(self, request: QueuedRequest) -> None:
        """`request` left the queue for an engine (after the queue book took it out)."""
        nested = self._nested.get((request.priority_class, request.user))
        if nested is None:
            return
        view = nested.running[request.request_id] = as_end_user(request)
        nested.fairness.account.on_dispatched(view)

    def generated(self, request: QueuedRequest, tokens: int) -> None:
        nested = self._nested.get((request.priority_class, request.user))
        if nested is not None and (view := nested.running.get(request.request_id)) is not None:
            nested.fairness.account.on_generated(view, tokens)

    def finished(self, request: QueuedRequest, generated: int, *, reached_engine: bool) -> None:
        key = (request.priority_class, request.user)
        nested = self._nested.get(key)
        if nested is None or (view := nested.running.pop(request.request_id, None)) is None:
            return
        nested.fairness.account.on_finished(view, generated, reached_engine=reached_engine)
        self._drop_if_idle(key, nested)

    def requeued(self, request: QueuedRequest) -> None:
        """`request` came back before its first token; it is queued again next (`queued`)."""
        nested = self._nested.get((request.priority_class, request.user))
        if nested is not None and (view := nested.running.pop(request.request_id, None)) is not None:
            nested.fairness.account.on_requeued(view)

    def _drop_if_idle(self, key: tuple[str, str], nested: _Nested) -> None:
        if not nested.flow and not nested.running:
            del self._nested[key]

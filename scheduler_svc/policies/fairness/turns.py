"""Turns: the account and chooser of round robin, where service is counted in turns, one request each.

The account keeps the band's backlogged users in turn order (a ring): a user who becomes backlogged joins
at the end, a user whose turn is taken moves to the end (or leaves the ring with its last queued request,
and rejoins at the end when it has more), and a user whose request failed over before its first token gets
its turn back at the front. The chooser takes the first user in turn order that a backend can take now; an
ineligible user keeps its place.

Pruning, safe rule: an idle user holds no place in the ring and nothing of it is needed (an entry left
behind by cancelled requests is moved to the end on return, so dropping it changes nothing).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from scheduler_svc.core.clock import Clock
from scheduler_svc.policies.cost import Counters, Prices
from scheduler_svc.policies.fairness.activity import UserActivity
from scheduler_svc.policies.fairness.base import Eligible
from scheduler_svc.policies.interfaces import FlowView, RequestView
from scheduler_svc.policies.weights import WeightResolver


@dataclass(frozen=True)
class TurnView:
    """What a round-robin choice reads: the backlogged flows and the users in turn order."""

    flows: Mapping[str, FlowView]
    ring: Mapping[str, None]

    def in_turn(self) -> Iterator[str]:
        """Users in turn order, next first (some may have nothing queued any more: skip them)."""
        return iter(self.ring)


class TurnAccount:
    """Round robin's account: the turn order, and the band's activity."""

    def __init__(self, weights: WeightResolver, clock: Clock, idle_ttl: float) -> None:
        self.activity = UserActivity(weights, clock, idle_ttl, safe_to_forget=lambda user: True, forget=self._forget)
        self._ring: OrderedDict[str, None] = OrderedDict()  # backlogged users, next to serve first
        self._given_back: str | None = None  # a user whose failed-over request just returned its turn

    def view(self, flows: Mapping[str, FlowView]) -> TurnView:
        """Users whose requests were cancelled or expired leave the ring as they reach its front (leaving it
        moves nobody else, and one that returns joins at the end either way), so a choice costs O(1)
        amortised however many users wait."""
        self.activity.flows = flows
        self._given_back = None  # a turn given back is kept only until the next choice
        ring = self._ring
        while ring and (first := next(iter(ring))) not in flows:
            del ring[first]
        return TurnView(flows, ring)

    def took_turn(self, user: str) -> None:
        if len(self.activity.flows[user]) > 1:
            self._ring.move_to_end(user)
        else:  # its last queued request goes now: it rejoins at the end when it has more
            del self._ring[user]

    def on_backlogged(self, user: str, flows: Mapping[str, FlowView]) -> None:
        if self._given_back == user:  # back after a failover: keeps the turn `on_requeued` gave back
            self._given_back = None
        else:
            self._ring[user] = None
            self._ring.move_to_end(user)
        self.activity.backlogged(user, flows)

    def on_dispatched(self, request: RequestView) -> None:
        self.activity.dispatched(request.user)

    def on_generated(self, request: RequestView, tokens: int) -> None:
        return None

    def on_finished(self, request: RequestView, generated: int, *, reached_engine: bool = True) -> None:
        self.activity.finished(request.user)

    def on_requeued(self, request: RequestView) -> None:
        """The user's turn was spent on a request the engine failed: give the turn back."""
        self.activity.ended(request.user)
        self._ring[request.user] = None
        self._ring.move_to_end(request.user, last=False)
        self._given_back = request.user

    def counts_at(self, prices: Prices) -> bool:
        return True  # a turn is a turn at any price

    def use_costing(self, prices: Prices, users: Counters, groups: Counters) -> None:
        return None  # turns cost nothing

    def counters(self) -> dict[str, float]:
        return {}

    def tracked_users(self) -> int:
        return self.activity.tracked_users()

    def _forget(self, user: str, expired: bool) -> bool:
        self._ring.pop(user, None)
        return True


class FirstInTurn:
    """Round robin's chooser: the first user in turn order that a backend can take now."""

    def select(self, view: TurnView, eligible: Eligible | None) -> str | None:
        for user in view.in_turn():
            if user in view.flows and (eligible is None or eligible(user)):
                return user
        if eligible is None:
            raise LookupError("select() called with backlogged flows that were never announced")
        return None

    def offer(self, view: TurnView, eligible: Eligible | None, bound: float, limit: int) -> list[str]:
        """Round robin keeps no deficit to trade for locality: its own choice alone."""
        chosen = self.select(view, eligible)
        return [] if chosen is None else [chosen]

    def wake_at(self) -> float | None:
        return None

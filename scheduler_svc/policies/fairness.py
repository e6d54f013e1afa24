"""Fairness policies: which user's flow of a band is served next.

A policy instance serves one band of one model and keeps its own state. The dispatcher tells it when a
flow becomes backlogged, when one of its requests is dispatched and when tokens are generated, so
token-cost policies work without the dispatcher knowing which policy it runs.

    round_robin            one request per backlogged user in turn; ignores weights
    weighted_round_robin   request counts in proportion to weights (stride scheduling)
    vtc                    Virtual Token Counter: prompt + generated tokens in proportion to weights
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Protocol

from scheduler_svc.policies.registry import Registry
from scheduler_svc.policies.weights import WeightResolver
from scheduler_svc.queues import FlowView
from scheduler_svc.request import RequestView


class FairnessPolicy(Protocol):
    """Chooses between the backlogged users of one band."""

    def on_backlogged(self, user: str, flows: Mapping[str, FlowView]) -> None:
        """`user`'s flow went from empty to non-empty; `flows` are all backlogged flows, it included."""
        ...

    def select(self, flows: Mapping[str, FlowView]) -> str:
        """The user whose flow is served next; `flows` is non-empty."""
        ...

    def on_dispatched(self, request: RequestView) -> None:
        """`request` left the queue for an engine."""
        ...

    def on_generated(self, user: str, tokens: int) -> None:
        """`tokens` more tokens were generated for `user` in this band."""
        ...

    def counters(self) -> dict[str, float]:
        """Per-user fair-share state for introspection (empty when the policy keeps none)."""
        ...


class RoundRobinFairness:
    """Serve backlogged users in turn, one request each: fair by request count.

    Trade-off: cheap and predictable, but a user asking for 1000-token answers gets 20x the engine time of
    one asking for 50-token answers, and weights are ignored. A user who becomes backlogged joins the end
    of the ring, so behind a flood they wait for at most one more of each other backlogged user's requests.
    """

    def __init__(self, weights: WeightResolver | None = None) -> None:
        self._ring: deque[str] = deque()
        self._in_ring: set[str] = set()

    def on_backlogged(self, user: str, flows: Mapping[str, FlowView]) -> None:
        if user not in self._in_ring:
            self._ring.append(user)
            self._in_ring.add(user)

    def select(self, flows: Mapping[str, FlowView]) -> str:
        while self._ring:
            user = self._ring.popleft()
            if user in flows:
                self._ring.append(user)
                return user
            self._in_ring.discard(user)  # went idle: forget it; it rejoins at the end when it returns
        raise LookupError("select() called with backlogged flows that were never announced")

    def on_dispatched(self, request: RequestView) -> None:
        return None

    def on_generated(self, user: str, tokens: int) -> None:
        return None

    def counters(self) -> dict[str, float]:
        return {}


class _VirtualCounterFairness:
    """Serve the backlogged user with the least weighted service so far, in two levels: first the group
    with the smallest counter, then its user with the smallest counter. Service is charged by subclasses
    (per request, or per token as tokens stream).

    A flow that becomes backlogged has its counter lifted to the smallest counter among the backlogged
    (its group's likewise), so idle time earns no credit and a returning user cannot monopolise the
    engine; it does not go down, so briefly going idle does not wipe out what a user consumed. Ties go to
    the flow that has been backlogged longest (the order of `flows`).
    """

    def __init__(self, weights: WeightResolver | None = None) -> None:
        self._weights = weights or WeightResolver()
        self._user_counter: dict[str, float] = {}
        self._group_counter: dict[str, float] = {}

    def on_backlogged(self, user: str, flows: Mapping[str, FlowView]) -> None:
        group = self._weights.group_of(user)
        others = [u for u in flows if u != user]
        peers = [u for u in others if self._weights.group_of(u) == group]
        if peers:  # users are compared only within their group
            floor = min(self._user_counter.get(u, 0.0) for u in peers)
            self._user_counter[user] = max(self._user_counter.get(user, 0.0), floor)
            return
        groups = {self._weights.group_of(u) for u in others}  # the group just became backlogged
        floor = min((self._group_counter.get(g, 0.0) for g in groups), default=0.0)
        self._group_counter[group] = max(self._group_counter.get(group, 0.0), floor)

    def select(self, flows: Mapping[str, FlowView]) -> str:
        best_group: tuple[float, str] | None = None
        best_user: dict[str, tuple[float, str]] = {}
        for user in flows:  # dict order: longest backlogged first, so strict < keeps the older on ties
            group = self._weights.group_of(user)
            counter = self._user_counter.get(user, 0.0)
            if group not in best_user or counter < best_user[group][0]:
                best_user[group] = (counter, user)
            group_counter = self._group_counter.get(group, 0.0)
            if best_group is None or group_counter < best_group[0]:
                best_group = (group_counter, group)
        assert best_group is not None, "select() needs at least one backlogged flow"
        return best_user[best_group[1]][1]

    def _charge(self, user: str, cost: float) -> None:
        group = self._weights.group_of(user)
        self._user_counter[user] = self._user_counter.get(user, 0.0) + cost / self._weights.user_weight(user)
        self._group_counter[group] = self._group_counter.get(group, 0.0) + cost / self._weights.group_weight(group)

    def on_dispatched(self, request: RequestView) -> None:
        return None

    def on_generated(self, user: str, tokens: int) -> None:
        return None

    def counters(self) -> dict[str, float]:
        return dict(self._user_counter)


class WeightedRoundRobinFairness(_VirtualCounterFairness):
    """Request-count shares in proportion to weights (stride scheduling): weights 1:2:4 get 1:2:4 requests.

    Trade-off: exact shares of requests, not of engine time; use `vtc` when request sizes differ a lot.
    """

    def on_dispatched(self, request: RequestView) -> None:
        self._charge(request.user, 1.0)


class VirtualTokenCounterFairness(_VirtualCounterFairness):
    """Virtual Token Counter (Sheng et al., OSDI 2024): shares of tokens in proportion to weights.

    Charged `w_p * prompt tokens / weight` at dispatch and `w_q / weight` per generated token as it
    streams, so a long generation is paid for while it runs and a user asking for 1000-token answers gets
    about as many tokens as one asking for 50-token answers. Trade-off: prompt tokens are estimated from
    the text until the engine reports them; the service gap between two backlogged users is bounded by
    about 2 * max(w_p * prompt length, w_q * tokens in a batch).
    """

    PROMPT_WEIGHT = 1.0
    GENERATED_WEIGHT = 2.0

    def on_dispatched(self, request: RequestView) -> None:
        self._charge(request.user, self.PROMPT_WEIGHT * request.prompt_tokens_estimate)

    def on_generated(self, user: str, tokens: int) -> None:
        self._charge(user, self.GENERATED_WEIGHT * tokens)


FAIRNESS_POLICIES: Registry[FairnessPolicy] = Registry("fairness")
FAIRNESS_POLICIES.register("round_robin", RoundRobinFairness, "one request per backlogged user in turn")
FAIRNESS_POLICIES.register(
    "weighted_round_robin", WeightedRoundRobinFairness, "request counts in proportion to user/group weights"
)
FAIRNESS_POLICIES.register(
    "vtc", VirtualTokenCounterFairness, "Virtual Token Counter: weighted shares of prompt + generated tokens"
)

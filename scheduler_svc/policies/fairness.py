"""Fairness policies: which user's flow of a band is served next.

A policy instance serves one band of one model and keeps its own state. The dispatcher tells it when a
flow becomes backlogged, when one of its requests is dispatched and when tokens are generated, so token-
cost policies (a Virtual Token Counter) can be added without touching the dispatcher.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Protocol

from scheduler_svc.policies.registry import Registry
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
    one asking for 50-token answers. A user who becomes backlogged joins the end of the ring, so behind a
    flood they wait for at most one more of each other backlogged user's requests.
    """

    def __init__(self) -> None:
        self._ring: deque[str] = deque()
        self._in_ring: set[str] = set()

    def on_backlogged(self, user: str, flows: Mapping[str, FlowView]) -> None:
        if user not in self._in_ring:
            self._ring.append(user)
            self._in_ring.add(user)

    def select(self, flows: Mapping[str, FlowView]) -> str:
        for user in flows:  # users the dispatcher never announced (defensive): join the ring
            if user not in self._in_ring:
                self.on_backlogged(user, flows)
        while True:
            user = self._ring.popleft()
            if user in flows:
                self._ring.append(user)
                return user
            self._in_ring.discard(user)  # went idle: forget it; it rejoins at the end when it returns

    def on_dispatched(self, request: RequestView) -> None:
        return None

    def on_generated(self, user: str, tokens: int) -> None:
        return None

    def counters(self) -> dict[str, float]:
        return {}


FAIRNESS_POLICIES: Registry[FairnessPolicy] = Registry("fairness")
FAIRNESS_POLICIES.register("round_robin", RoundRobinFairness, "one request per backlogged user in turn")

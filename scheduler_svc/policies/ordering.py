"""Ordering policies: which request of one user's flow goes first."""

from __future__ import annotations

from typing import Protocol

from scheduler_svc.policies.registry import Registry
from scheduler_svc.queues import FlowView
from scheduler_svc.request import RequestView


class OrderingPolicy(Protocol):
    """Chooses within one user's queue of one band."""

    def select(self, flow: FlowView) -> RequestView:
        """The request of `flow` (non-empty) to dispatch next."""
        ...


class FcfsOrdering:
    """First come, first served: a user's requests run in the order they sent them."""

    def select(self, flow: FlowView) -> RequestView:
        return flow.head()


ORDERING_POLICIES: Registry[OrderingPolicy] = Registry("ordering")
ORDERING_POLICIES.register("fcfs", FcfsOrdering, "a user's requests in arrival order")

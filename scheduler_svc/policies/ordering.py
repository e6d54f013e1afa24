"""Ordering policies: which request of one user's queue (flow) in a band goes first.

An ordering policy gives each queued request a sort key (`OrderKey`, smaller first); the flow keeps its
requests sorted by it (`scheduler_svc.core.queues.Flow`), equal keys in arrival order. From that one order
follow the three things that depend on it:

- which request of the user goes next: the flow's head;
- `position_in_user_queue` (streaming `Queued` events, and what the estimated wait builds on): the
  request's 1-based rank in this order within its user's queue of its class. It can grow as well as
  shrink when the order is not arrival order (a later request may overtake it);
- a request put back after a failed dispatch (failover) goes first again for its user, whatever the key.

A band's starvation age does not follow the order: it is the age of the band's oldest queued request
(see `Band.oldest_admission` for why).
"""

from __future__ import annotations

import math
from typing import Protocol

from scheduler_svc.policies.interfaces import OrderKey, RequestView
from scheduler_svc.policies.registry import Registry


class OrderingPolicy(Protocol):
    """Orders the requests within one user's queue of one band."""

    def key(self, request: RequestView) -> OrderKey:
        """Sort key of `request` (smaller goes first; ties go in arrival order). It is read once, when the
        request is queued, so it must depend only on what does not change while it waits."""
        ...


class FcfsOrdering:
    """First come, first served: a user's requests run in the order they sent them (position = how many of
    the user's requests of the class arrived before it and still wait, plus one)."""

    def key(self, request: RequestView) -> OrderKey:
        return ()


class EdfOrdering:
    """Earliest deadline first: a user's request that must leave the queue soonest goes first.

    The deadline is the request's queue deadline: the call's deadline, or when the call sets none the
    class's queue TTL (admitted_at + queue_ttl_seconds), the earlier of the two when both are set (the
    moment it would expire in the queue). Requests with neither go last; equal deadlines go in arrival
    order. A user's requests of one class share the TTL, so without call deadlines this is arrival order.
    Position: the rank by deadline within the user's queue, so a newcomer with a closer deadline moves the
    user's later-deadline requests back one.
    """

    def key(self, request: RequestView) -> OrderKey:
        return (math.inf if request.deadline is None else request.deadline,)


ORDERING_POLICIES: Registry[OrderingPolicy] = Registry("ordering")
ORDERING_POLICIES.register("fcfs", FcfsOrdering, "a user's requests in arrival order")
ORDERING_POLICIES.register(
    "edf",
    EdfOrdering,
    "earliest deadline first within a user's queue (call deadline, else class queue TTL; none: last; "
    "ties in arrival order)",
)

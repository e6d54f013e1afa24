"""A snapshot of one model's dispatch for an operator: what is queued per class and user, each user's
fair-share counter, every backend's gate state and whether it drains, the drain rate. Plain data: the gRPC
face turns it into GetQueueState's answer (`grpc.introspection`).

Bounded by construction: at most `max_users` users per class (the most queued first), whatever the number of
users, and with `user` set only that user's entries.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler_svc.core.queues import Band
from scheduler_svc.dispatch.backend_handle import BackendHandle, Drain
from scheduler_svc.dispatch.openings import BackendState
from scheduler_svc.dispatch.queue_book import QueueBook
from scheduler_svc.policies import Fairness


@dataclass(frozen=True, slots=True)
class UserSnapshot:
    user: str
    queued: int
    fair_share_counter: float | None  # None: the class's fairness policy keeps no counter for the user
    end_users: int = 0  # named end users with requests queued in the band


@dataclass(frozen=True, slots=True)
class ClassSnapshot:
    priority_class: str
    rank: int
    queued: int
    users: list[UserSnapshot]  # most queued first, then by name
    users_total: int  # users with anything queued or counted, before `max_users` cut the list
    truncated: bool
    tracked_users: int  # users the class's fairness policy keeps any state for (idle ones are forgotten)
    removed: bool = False  # the class left the configuration: it serves what it holds, then goes


@dataclass(frozen=True, slots=True)
class BackendStatus:
    """A backend of the model: whether it takes new requests, and what it runs."""

    name: str
    drains: tuple[Drain, ...]  # why it takes no new request (empty: it takes work), in `Drain`'s order
    in_flight: int


def backend_status(handle: BackendHandle) -> BackendStatus:
    return BackendStatus(handle.name, tuple(d for d in Drain if d in handle.drains), handle.estimator.in_flight)


@dataclass(frozen=True, slots=True)
class ModelSnapshot:
    model: str
    queued: int
    running: int
    held_prompt_bytes: int  # what the queued and running requests hold (`max_queued_bytes` caps it)
    drain_rate_per_second: float
    classes: list[ClassSnapshot]
    gates: list[BackendState]
    backends: list[BackendStatus]
    removed: bool = False  # the model left the configuration: it admits nothing, serves what it holds, then goes


def class_snapshots(
    book: QueueBook,
    fairness: Mapping[str, Fairness],
    user: str,
    max_users: int,
    retiring: frozenset[str] = frozenset(),
) -> list[ClassSnapshot]:
    """Each band's depth per user with its fair-share counter, at most `max_users` users per band, most queued
    first (O(n log max_users)); only `user` when it is set."""
    classes = []
    for band in book.bands:
        policy = fairness[band.priority_class.name]
        counted = policy.account.counters()
        names = ({user} & (band.flows.keys() | counted.keys())) if user else band.flows.keys() | counted.keys()
        depths = {name: len(band.flows[name]) if name in band.flows else 0 for name in names}
        shown = heapq.nsmallest(max_users, depths, key=lambda name: (-depths[name], name))
        classes.append(
            ClassSnapshot(
                priority_class=band.priority_class.name,
                rank=band.priority_class.rank,
                queued=band.size,
                users=[UserSnapshot(name, depths[name], counted.get(name), _end_users(band, name)) for name in shown],
                users_total=len(names),
                truncated=len(shown) < len(names),
                tracked_users=policy.account.tracked_users(),
                removed=band.priority_class.name in retiring,
            )
        )
    return classes


def _end_users(band: Band, user: str) -> int:
    """The named end users with requests of `user` queued in `band` (its requests naming none are not one)."""
    flow = band.flows.get(user)
    return 0 if flow is None else sum(1 for end_user in flow.end_user_flows if end_user)


def model_snapshot(
    model: str,
    book: QueueBook,
    running: int,
    held_prompt_bytes: int,
    drain_rate: float,
    fairness: Mapping[str, Fairness],
    gates: Sequence[BackendState],
    *,
    user: str,
    max_users: int,
    backends: Sequence[BackendStatus] = (),
    retiring_classes: frozenset[str] = frozenset(),
) -> ModelSnapshot:
    return ModelSnapshot(
        model=model,
        queued=len(book),
        running=running,
        held_prompt_bytes=held_prompt_bytes,
        drain_rate_per_second=drain_rate,
        classes=class_snapshots(book, fairness, user, max_users, retiring_classes),
        gates=list(gates),
        backends=list(backends),
    )

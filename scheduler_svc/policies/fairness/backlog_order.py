"""What the counter policies ask of a band's backlog, answered by an order of its users (`BacklogOrder`).

A least-served choice compares keys (a counter plus what is pending or reserved), a returning user is
lifted to a floor (the least settled counter among its backlogged peers), and a choice may wait for a
user behind it whose request just ended. Each of these questions is about the smallest of something among
the backlogged users, so it can be answered from an order kept as the keys change (`backlog_index`, the
service's), or by walking every backlogged user (`backlog_scan`: the specification, which the index is
checked against step by step, and the baseline the scale bench measures it against).

Every answer is the scan's exactly: the same floating-point keys compared the same way, ties to the user
that became backlogged first (the order of the band's flows), strict `<` keeping the older.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from scheduler_svc.policies.fairness.base import Eligible
from scheduler_svc.policies.interfaces import FlowView
from scheduler_svc.policies.weights import WeightResolver


class CounterKeys(Protocol):
    """What an order reads of the account: its keys and settled counters, and who ended recently."""

    @property
    def weights(self) -> WeightResolver: ...

    @property
    def ended_at(self) -> Mapping[str, float]:
        """User -> when its last request ended, oldest first, for users a choice may wait for."""
        ...

    def user_key(self, user: str) -> float: ...

    def group_key(self, group: str) -> float: ...

    def user_settled(self, user: str) -> float:
        """The user's settled counter (what a returning peer is lifted to)."""
        ...

    def group_settled(self, group: str) -> float: ...

    def forget_ended(self, users: list[str]) -> None:
        """These users' return grace is over."""
        ...


@dataclass(slots=True)
class Choice:
    """The least-served eligible user, with the group key and user key it won with."""

    user: str
    group: str
    group_key: float
    user_key: float


class AttachedKeys:
    """The account an order reads its keys from, given once by `attach` (the account is built first)."""

    def __init__(self) -> None:
        self._keys: CounterKeys | None = None

    @property
    def keys(self) -> CounterKeys:
        assert self._keys is not None, "attach() first"
        return self._keys

    def attach(self, keys: CounterKeys) -> None:
        self._keys = keys


class BacklogOrder(Protocol):
    """The band's backlogged users as the counter policies compare them. The account tells it of every
    event that may change what it holds (`backlogged`, `moved`, `ended`, `forgot_ended`); a user whose
    flow emptied without an event (cancelled, expired) is dropped when next met (`refresh` or a walk)."""

    def attach(self, keys: CounterKeys) -> None:
        """Read keys from `keys` from now on (before any event)."""
        ...

    def backlogged(self, user: str, flows: Mapping[str, FlowView]) -> None:
        """`user`'s flow just became non-empty (it is last in backlog order); `flows` are the band's live
        flows (the same mapping every time)."""
        ...

    def seen(self, flows: Mapping[str, FlowView]) -> None:
        """A choice looks at the band now, over `flows`."""
        ...

    def moved(self, user: str | None, group: str | None) -> None:
        """The user's key (or its settled counter), or the group's, may have changed; `group`, given with
        `user`, is the user's own."""
        ...

    def ended(self, user: str) -> None:
        """The account set `ended_at[user]` (the user is last in its order)."""
        ...

    def forgot_ended(self, user: str) -> None:
        """The account dropped `ended_at[user]`."""
        ...

    def refresh(self, user: str) -> None:
        """A bounded sweep met `user`: drop what is kept of it if its flow is empty."""
        ...

    def floors(self) -> tuple[float, dict[str, float]]:
        """The least settled group counter among the backlogged users' groups, and per shared group with
        backlogged members the least settled counter among them."""
        ...

    def peer_floor(self, user: str, group: str) -> float | None:
        """The least settled counter among the other backlogged users of `user`'s group (None: none)."""
        ...

    def other_groups_floor(self, user: str, group: str) -> float | None:
        """The least settled group counter among the groups of the other backlogged users, when `user` has
        no peer in `group` (None: the band has nobody else)."""
        ...

    def least_served(self, eligible: Eligible | None) -> Choice | None:
        """The eligible group with the smallest key, then its eligible user with the smallest key, ties to
        the one backlogged first (None: nobody is eligible)."""
        ...

    def within(self, chosen: str, eligible: Eligible | None, bound: float, limit: int) -> list[str]:
        """`chosen`, then in backlog order the other eligible users whose group key is within `bound` of
        `chosen`'s group key and whose key is within `bound` of the least key among its group's eligible
        users: at most `limit` users in all, the least served first (by group key, then by key within a
        group; which of equal keys is taken is not specified)."""
        ...

    def returning_hold(self, choice: Choice, now: float, grace: float) -> float | None:
        """Drop the ends older than `grace`; then the earliest time one of the users that ended within it,
        has nothing queued and is behind `choice` (by user key in its group, else by group key) stops being
        waited for (None: nobody is)."""
        ...

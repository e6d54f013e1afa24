"""The backlog answered by walking every backlogged user: the specification of `BacklogOrder`.

Each answer is a walk over the band's flows in backlog order, as the counter policies were first written:
O(n) in the users backlogged. The service uses the index (`backlog_index`); this one states what the index
must answer, step by step (tests/unit/test_backlog_index.py), and is the baseline of the scale bench
(bench/scenarios/s9/).
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler_svc.policies.fairness.backlog_order import AttachedKeys, Choice
from scheduler_svc.policies.fairness.base import Eligible
from scheduler_svc.policies.interfaces import FlowView


class BacklogScan(AttachedKeys):
    """`BacklogOrder` by walking the flows; keeps nothing but the flows it was shown."""

    def __init__(self) -> None:
        super().__init__()
        self._flows: Mapping[str, FlowView] = {}

    def backlogged(self, user: str, flows: Mapping[str, FlowView]) -> None:
        self._flows = flows

    def seen(self, flows: Mapping[str, FlowView]) -> None:
        self._flows = flows

    def moved(self, user: str | None, group: str | None) -> None:
        return None

    def ended(self, user: str) -> None:
        return None

    def forgot_ended(self, user: str) -> None:
        return None

    def refresh(self, user: str) -> None:
        return None

    def floors(self) -> tuple[float, dict[str, float]]:
        keys = self.keys
        band_floor = float("inf")
        member_floor: dict[str, float] = {}
        for user in self._flows:
            group = keys.weights.group_of(user)
            band_floor = min(band_floor, keys.group_settled(group))
            if keys.weights.is_shared(group):
                settled = keys.user_settled(user)
                member_floor[group] = min(member_floor.get(group, settled), settled)
        return band_floor, member_floor

    def peer_floor(self, user: str, group: str) -> float | None:
        keys = self.keys
        peers = [u for u in self._flows if u != user and keys.weights.group_of(u) == group]
        return min(keys.user_settled(u) for u in peers) if peers else None

    def other_groups_floor(self, user: str, group: str) -> float | None:
        keys = self.keys
        groups = {keys.weights.group_of(u) for u in self._flows if u != user}
        return min(keys.group_settled(g) for g in groups) if groups else None

    def least_served(self, eligible: Eligible | None) -> Choice | None:
        keys = self.keys
        best_group: tuple[float, str] | None = None
        best_user: dict[str, tuple[float, str]] = {}
        for user in self._flows:  # backlog order: strict < keeps the older on ties
            if eligible is not None and not eligible(user):
                continue
            group = keys.weights.group_of(user)
            key = keys.user_key(user)
            if group not in best_user or key < best_user[group][0]:
                best_user[group] = (key, user)
            group_key = keys.group_key(group)
            if best_group is None or group_key < best_group[0]:
                best_group = (group_key, group)
        if best_group is None:
            return None
        user_key, user = best_user[best_group[1]]
        return Choice(user, best_group[1], best_group[0], user_key)

    def within(self, chosen: str, eligible: Eligible | None, bound: float, limit: int) -> list[str]:
        keys = self.keys
        group_of = keys.weights.group_of
        allowed = [u for u in self._flows if eligible is None or eligible(u)]
        group_floor = keys.group_key(group_of(chosen))  # the least served group
        user_floor: dict[str, float] = {}
        for user in allowed:
            group = group_of(user)
            user_floor[group] = min(user_floor.get(group, float("inf")), keys.user_key(user))
        others = [
            u
            for u in allowed
            if u != chosen
            and keys.group_key(group_of(u)) <= group_floor + bound
            and keys.user_key(u) <= user_floor[group_of(u)] + bound
        ]
        if len(others) >= limit:  # the least served: by group key, then by key (ties in backlog order)
            position = {user: i for i, user in enumerate(self._flows)}
            first_member: dict[str, int] = {}
            for user in self._flows:
                first_member.setdefault(group_of(user), position[user])
            least = sorted(
                others,
                key=lambda u: (keys.group_key(group_of(u)), first_member[group_of(u)], keys.user_key(u), position[u]),
            )
            kept = set(least[: limit - 1])
            others = [u for u in others if u in kept]
        return [chosen, *others]

    def returning_hold(self, choice: Choice, now: float, grace: float) -> float | None:
        keys = self.keys
        hold: float | None = None
        over = []
        for user, ended in keys.ended_at.items():
            if now >= ended + grace:
                over.append(user)
                continue
            if user in self._flows:  # a candidate already
                continue
            group = keys.weights.group_of(user)
            if group == choice.group:
                behind = keys.user_key(user) < choice.user_key
            else:
                behind = keys.group_key(group) < choice.group_key
            if behind:
                until = ended + grace
                hold = until if hold is None else min(hold, until)
        keys.forget_ended(over)
        return hold

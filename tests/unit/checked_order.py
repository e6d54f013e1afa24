"""A backlog order that answers every question twice, from the index and from the scan, and fails on the
first answer that differs: the index is checked against its specification at every step of a workload.

`checking()` makes every counter account built while it is active use one, so a whole dispatcher (the golden
scenarios, the random workloads) runs on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import pytest

from scheduler_svc.policies.fairness import counters
from scheduler_svc.policies.fairness.backlog_index import BacklogIndex
from scheduler_svc.policies.fairness.backlog_order import Choice, CounterKeys
from scheduler_svc.policies.fairness.backlog_scan import BacklogScan
from scheduler_svc.policies.fairness.base import Eligible
from scheduler_svc.policies.interfaces import FlowView


class CheckedOrder:
    """`BacklogOrder`: the index's answers, each asserted equal to the scan's (`questions` counts them)."""

    def __init__(self) -> None:
        self.index = BacklogIndex()
        self.scan = BacklogScan()
        self.questions = 0

    def _same(self, what: str, indexed: object, scanned: object) -> None:
        self.questions += 1
        assert indexed == scanned, f"{what}: index {indexed!r} != scan {scanned!r}"

    def attach(self, keys: CounterKeys) -> None:
        self.index.attach(keys)
        self.scan.attach(keys)

    def backlogged(self, user: str, flows: Mapping[str, FlowView]) -> None:
        self.index.backlogged(user, flows)
        self.scan.backlogged(user, flows)

    def seen(self, flows: Mapping[str, FlowView]) -> None:
        self.index.seen(flows)
        self.scan.seen(flows)

    def moved(self, user: str | None, group: str | None) -> None:
        if user is not None and group is not None:  # the index looks up the user's group no further
            assert group == self.index.keys.weights.group_of(user), f"{group} is not {user}'s group"
        self.index.moved(user, group)

    def ended(self, user: str) -> None:
        self.index.ended(user)

    def forgot_ended(self, user: str) -> None:
        self.index.forgot_ended(user)

    def refresh(self, user: str) -> None:
        self.index.refresh(user)

    def floors(self) -> tuple[float, dict[str, float]]:
        answer = self.index.floors()
        self._same("floors", answer, self.scan.floors())
        return answer

    def peer_floor(self, user: str, group: str) -> float | None:
        answer = self.index.peer_floor(user, group)
        self._same(f"peer_floor({user})", answer, self.scan.peer_floor(user, group))
        return answer

    def other_groups_floor(self, user: str, group: str) -> float | None:
        answer = self.index.other_groups_floor(user, group)
        self._same(f"other_groups_floor({user})", answer, self.scan.other_groups_floor(user, group))
        return answer

    def least_served(self, eligible: Eligible | None) -> Choice | None:
        answer = self.index.least_served(eligible)
        self._same("least_served", answer, self.scan.least_served(eligible))
        return answer

    def within(self, chosen: str, eligible: Eligible | None, bound: float, limit: int) -> list[str]:
        """Below the limit, the same users; at it (which of equal keys is taken is left open), as many, all
        within the bound, `chosen` first, with the same group keys as the scan's least served."""
        answer = self.index.within(chosen, eligible, bound, limit)
        everyone = self.scan.within(chosen, eligible, bound, 10**9)  # no limit
        scanned = self.scan.within(chosen, eligible, bound, limit)
        what = f"within({chosen}, {bound}, {limit})"
        if len(everyone) <= limit:
            self._same(what, answer, scanned)
            return answer
        group_key = self.scan.keys.group_key
        group_of = self.scan.keys.weights.group_of
        self._same(f"{what}: how many", len(answer), len(scanned))
        self._same(f"{what}: first", answer[0], chosen)
        self._same(f"{what}: within the bound", set(answer) <= set(everyone), True)
        self._same(
            f"{what}: group keys",
            sorted(group_key(group_of(u)) for u in answer),
            sorted(group_key(group_of(u)) for u in scanned),
        )
        return answer

    def returning_hold(self, choice: Choice, now: float, grace: float) -> float | None:
        answer = self.index.returning_hold(choice, now, grace)  # drops the ends past the grace: the scan
        self._same("returning_hold", answer, self.scan.returning_hold(choice, now, grace))  # then finds none
        return answer


@contextlib.contextmanager
def checking(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[CheckedOrder]]:
    """Every counter account built inside the block checks its index against the scan; yields the orders."""
    made: list[CheckedOrder] = []

    def make() -> CheckedOrder:
        made.append(CheckedOrder())
        return made[-1]

    with monkeypatch.context() as patch:
        patch.setattr(counters, "BacklogIndex", make)
        yield made

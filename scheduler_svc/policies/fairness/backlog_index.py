"""The backlog as an index: a band's backlogged users and groups kept in the orders the counter policies
compare, so a choice, a lift and a floor cost O(log n) in the users backlogged instead of a walk over all.

Kept orders (`SortedList`s, each entry holding the key it was filed under):

- groups by (key, backlog position of their first member), and by settled counter (the band's floor);
- in each shared group, its members by (key, backlog position) and by settled counter (its floor);
- the users that ended within the return grace and the groups they are in, by key, oldest end first
  within a group (what a choice may wait for).

Every key change reaches the index through the account (`moved`), which refiles the user and its group.
The backlog position is a number given when a user's flow becomes non-empty (`backlogged`), so it orders
users exactly as the band's flows do, and a tie between equal keys goes to the older, as a walk with
strict `<` does. A user whose flow empties without an event (cancelled, expired, taken by another
replica) stays filed until it is met: a walk skips and drops it, and so does the account's bounded
sweep (`refresh`), so nothing is kept for long of a user that left.

A group's entry is filed under the position of its first member when filed; if that member leaves, the
entry's position is a lower bound of the group's first eligible member's, which is all a choice needs:
among groups of equal key it looks on while a group's filed position is below the best found.

Walks from the front: a choice walks groups in key order until the first with an eligible member (and
past it only through groups of the same key that could hold an older eligible member); the locality
window walks the groups and users within its bound; the return grace walks the users behind the choice.
Each skips only users that cannot go now, which dispatch keeps few (`dispatch.openings`: a user's
eligibility depends only on its requests in flight, and all users with none share one answer).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from sortedcontainers import SortedList

from scheduler_svc.policies.fairness.backlog_order import AttachedKeys, Choice
from scheduler_svc.policies.fairness.base import Eligible
from scheduler_svc.policies.interfaces import FlowView

_KeyEntry = tuple[float, int, str]  # (key, backlog position, user or group)
_SettledEntry = tuple[float, str]


class _Group:
    """One group's filed state: its backlogged members in backlog order (some may have left since), its two
    entries in the band's orders, and for a shared group its members' own orders."""

    __slots__ = ("by_key", "by_settled", "entry", "members", "settled_entry", "shared", "user_entries")

    def __init__(self, shared: bool) -> None:
        self.shared = shared
        self.members: OrderedDict[str, int] = OrderedDict()  # user -> backlog position, oldest first
        self.entry: _KeyEntry | None = None
        self.settled_entry: _SettledEntry | None = None
        self.by_key: SortedList = SortedList()  # (user key, position, user), shared groups only
        self.by_settled: SortedList = SortedList()  # (settled, position, user), shared groups only
        self.user_entries: dict[str, tuple[_KeyEntry, _KeyEntry]] = {}


class _Recent:
    """One group's users that ended within the return grace: when, oldest first; by key in a shared group."""

    __slots__ = ("by_key", "entry", "members", "user_entries")

    def __init__(self) -> None:
        self.members: OrderedDict[str, float] = OrderedDict()  # user -> when its request ended, oldest first
        self.entry: _SettledEntry | None = None  # (group key, group) in the band's order of recent groups
        self.by_key: SortedList = SortedList()  # (user key, user), shared groups only
        self.user_entries: dict[str, _SettledEntry] = {}


class BacklogIndex(AttachedKeys):
    """`BacklogOrder` from kept orders (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._flows: Mapping[str, FlowView] = {}
        self._position = 0
        self._group_of: dict[str, str] = {}  # filed users -> their group
        self._groups: dict[str, _Group] = {}
        self._shared: dict[str, _Group] = {}  # the shared groups among them
        self._by_key: SortedList = SortedList()  # (group key, position of its first member, group)
        self._by_settled: SortedList = SortedList()  # (group settled counter, group)
        self._recent: dict[str, _Recent] = {}  # group -> its users that ended within the grace
        self._recent_by_key: SortedList = SortedList()  # (group key, group) of those groups
        self._stale_groups: list[str] = []  # met by a walk with nobody backlogged: refiled by `_tidy`
        self._stale_users: list[tuple[str, str]] = []  # (group, member) met by a walk that left: dropped by `_tidy`

    def filed_users(self) -> int:
        """Users filed (backlogged, or left and not met since): what the index holds."""
        return len(self._group_of)

    # -- events ----------------------------------------------------------------------------------------------
    def backlogged(self, user: str, flows: Mapping[str, FlowView]) -> None:
        self._tidy()
        self._flows = flows
        self._position += 1
        weights = self.keys.weights
        group = weights.group_of(user)
        filed = self._groups.get(group)
        if filed is None:
            filed = self._groups[group] = _Group(weights.is_shared(group))
            if filed.shared:
                self._shared[group] = filed
        filed.members.pop(user, None)
        filed.members[user] = self._position
        self._group_of[user] = group

    def seen(self, flows: Mapping[str, FlowView]) -> None:
        self._tidy()
        self._flows = flows

    def moved(self, user: str | None, group: str | None) -> None:
        self._tidy()
        if user is not None:
            filed_in = self._group_of.get(user)
            if filed_in is not None:
                self._refile_user(user, filed_in)
            recent_in = group if group is not None else self.keys.weights.group_of(user)
            if (recent := self._recent.get(recent_in)) is not None and user in recent.members:
                self._refile_recent_user(recent, user)
        if group is not None:
            self._refile_group(group)
            if (recent := self._recent.get(group)) is not None:
                self._refile_recent_group(recent, group)

    def ended(self, user: str) -> None:
        self._tidy()
        keys = self.keys
        group = keys.weights.group_of(user)
        recent = self._recent.get(group)
        if recent is None:
            recent = self._recent[group] = _Recent()
        recent.members.pop(user, None)
        recent.members[user] = keys.ended_at[user]
        self._refile_recent_user(recent, user)
        self._refile_recent_group(recent, group)

    def forgot_ended(self, user: str) -> None:
        self._tidy()
        group = self.keys.weights.group_of(user)
        recent = self._recent.get(group)
        if recent is None or recent.members.pop(user, None) is None:
            return
        if (entry := recent.user_entries.pop(user, None)) is not None:
            recent.by_key.remove(entry)
        if not recent.members:
            if recent.entry is not None:
                self._recent_by_key.remove(recent.entry)
            del self._recent[group]

    def refresh(self, user: str) -> None:
        self._tidy()
        group = self._group_of.get(user)
        if group is not None and user not in self._flows:
            self._drop_member(self._groups[group], user)
            self._refile_group(group)

    # -- what the account asks -------------------------------------------------------------------------------
    def floors(self) -> tuple[float, dict[str, float]]:
        self._tidy()
        band_floor = float("inf")
        for entry, _ in self._walk_groups(self._by_settled, 1):
            band_floor = entry[0]
            break
        member_floor: dict[str, float] = {}
        for group, filed in self._shared.items():
            for entry in self._walk_users(group, filed.by_settled):
                member_floor[group] = entry[0]
                break
        return band_floor, member_floor

    def peer_floor(self, user: str, group: str) -> float | None:
        self._tidy()
        filed = self._groups.get(group)
        if filed is None or not filed.shared:
            return None  # a group of one user has no peers
        for entry in self._walk_users(group, filed.by_settled):
            if entry[2] != user:
                return entry[0]
        return None

    def other_groups_floor(self, user: str, group: str) -> float | None:
        self._tidy()
        for entry, other in self._walk_groups(self._by_settled, 1):
            if other != group:
                floor: float = entry[0]
                return floor
        return None

    def least_served(self, eligible: Eligible | None) -> Choice | None:
        self._tidy()
        best: tuple[float, int, str, str] | None = None  # (group key, position of its first eligible, group, user)
        for entry, group in self._walk_groups(self._by_key, 2):
            key, filed_position = entry[0], entry[1]
            if best is not None and (key > best[0] or filed_position >= best[1]):
                break  # no group further on can hold an older eligible user of the least key
            first = self._first_eligible(self._groups[group], eligible)
            if first is not None and (best is None or first[0] < best[1]):
                best = (key, first[0], group, first[1])
        if best is None:
            return None
        group_key, _, group, user = best
        filed = self._groups[group]
        if not filed.shared:
            return Choice(user, group, group_key, self.keys.user_key(user))
        for user_entry in self._walk_users(group, filed.by_key):
            if eligible is None or eligible(user_entry[2]):
                return Choice(user_entry[2], group, group_key, user_entry[0])
        raise AssertionError("a group with an eligible member has no eligible member in its key order")

    def within(self, chosen: str, eligible: Eligible | None, bound: float, limit: int) -> list[str]:
        self._tidy()
        keys = self.keys
        ceiling = keys.group_key(keys.weights.group_of(chosen)) + bound
        found: list[tuple[int, str]] = []
        for entry, group in self._walk_groups(self._by_key, 2):
            if not entry[0] <= ceiling or len(found) >= limit - 1:
                break
            filed = self._groups[group]
            if not filed.shared:
                user, position = next(iter(filed.members.items()))
                if user != chosen and (eligible is None or eligible(user)):
                    found.append((position, user))
                continue
            floor: float | None = None
            for user_entry in self._walk_users(group, filed.by_key):
                if floor is None:
                    if eligible is not None and not eligible(user_entry[2]):
                        continue
                    floor = user_entry[0] + bound
                if not user_entry[0] <= floor or len(found) >= limit - 1:
                    break
                user = user_entry[2]
                if user != chosen and (eligible is None or eligible(user)):
                    found.append((user_entry[1], user))
        found.sort()
        return [chosen, *(user for _, user in found)]

    def returning_hold(self, choice: Choice, now: float, grace: float) -> float | None:
        self._tidy()
        keys = self.keys
        over = []
        for user, ended in keys.ended_at.items():  # oldest first: the ends past the grace lead
            if now < ended + grace:
                break
            over.append(user)
        keys.forget_ended(over)
        hold: float | None = None
        for key, group in self._recent_by_key:
            if not key < choice.group_key:
                break
            if group == choice.group:
                continue
            for user, ended in self._recent[group].members.items():  # its oldest end not queued again
                if user not in self._flows:
                    until = ended + grace
                    hold = until if hold is None else min(hold, until)
                    break
        recent = self._recent.get(choice.group)
        if recent is not None and keys.weights.is_shared(choice.group):
            for user_key, user in recent.by_key:
                if not user_key < choice.user_key:
                    break
                if user not in self._flows:
                    until = recent.members[user] + grace
                    hold = until if hold is None else min(hold, until)
        return hold

    # -- walks -------------------------------------------------------------------------------------------------
    def _walk_groups(self, order: SortedList, group_at: int) -> Iterator[tuple[Any, str]]:
        """The entries of a band-level order, front first, with their group, skipping groups none of whose
        members is backlogged any more (refiled at the next event or question: never during a walk). The
        group is the entry's item `group_at`."""
        for entry in order:
            group = entry[group_at]
            if self._first_live(self._groups[group]) is None:
                self._stale_groups.append(group)
                continue
            yield entry, group

    def _walk_users(self, group: str, order: SortedList) -> Iterator[_KeyEntry]:
        """The entries of one shared group's own order, front first, skipping members that left (dropped at
        the next event or question)."""
        for entry in order:
            if entry[2] not in self._flows:
                self._stale_users.append((group, entry[2]))
                continue
            yield entry

    def _tidy(self) -> None:
        """Drop what the last walks found left (they may not change the orders they walk)."""
        while self._stale_users:
            group, user = self._stale_users.pop()
            filed = self._groups.get(group)
            if filed is not None and user in filed.members and user not in self._flows:
                self._drop_member(filed, user)
        while self._stale_groups:
            self._refile_group(self._stale_groups.pop())

    def _first_live(self, filed: _Group) -> str | None:
        """The group's first member still backlogged (members that left ahead of it are dropped)."""
        members = filed.members
        while members:
            user = next(iter(members))
            if user in self._flows:
                return user
            self._drop_member(filed, user)
        return None

    def _first_eligible(self, filed: _Group, eligible: Eligible | None) -> tuple[int, str] | None:
        """The backlog position and name of the group's first backlogged member that may go now."""
        for user, position in filed.members.items():
            if user in self._flows and (eligible is None or eligible(user)):
                return position, user
        return None

    # -- filing --------------------------------------------------------------------------------------------------
    def _refile_user(self, user: str, group: str) -> None:
        filed = self._groups[group]
        if user not in self._flows:
            self._drop_member(filed, user)
            return
        if not filed.shared:
            return  # a group of one: its own entry is the user's
        keys = self.keys
        position = filed.members[user]
        entries = ((keys.user_key(user), position, user), (keys.user_settled(user), position, user))
        old = filed.user_entries.get(user)
        if old == entries:
            return
        if old is not None:
            filed.by_key.remove(old[0])
            filed.by_settled.remove(old[1])
        filed.by_key.add(entries[0])
        filed.by_settled.add(entries[1])
        filed.user_entries[user] = entries

    def _drop_member(self, filed: _Group, user: str) -> None:
        filed.members.pop(user, None)
        self._group_of.pop(user, None)
        old = filed.user_entries.pop(user, None)
        if old is not None:
            filed.by_key.remove(old[0])
            filed.by_settled.remove(old[1])

    def _refile_group(self, group: str) -> None:
        filed = self._groups.get(group)
        if filed is None:
            return
        first = self._first_live(filed)
        if first is None:
            if filed.entry is not None:
                assert filed.settled_entry is not None
                self._by_key.remove(filed.entry)
                self._by_settled.remove(filed.settled_entry)
            del self._groups[group]
            self._shared.pop(group, None)
            return
        keys = self.keys
        entry = (keys.group_key(group), filed.members[first], group)
        settled_entry = (keys.group_settled(group), group)
        if entry != filed.entry:  # an entry that did not change stays where it is filed
            if filed.entry is not None:
                self._by_key.remove(filed.entry)
            self._by_key.add(entry)
            filed.entry = entry
        if settled_entry != filed.settled_entry:
            if filed.settled_entry is not None:
                self._by_settled.remove(filed.settled_entry)
            self._by_settled.add(settled_entry)
            filed.settled_entry = settled_entry

    def _refile_recent_user(self, recent: _Recent, user: str) -> None:
        group = self.keys.weights.group_of(user)
        if not self.keys.weights.is_shared(group):
            return
        entry = (self.keys.user_key(user), user)
        old = recent.user_entries.get(user)
        if old == entry:
            return
        if old is not None:
            recent.by_key.remove(old)
        recent.by_key.add(entry)
        recent.user_entries[user] = entry

    def _refile_recent_group(self, recent: _Recent, group: str) -> None:
        entry = (self.keys.group_key(group), group)
        if entry == recent.entry:
            return
        if recent.entry is not None:
            self._recent_by_key.remove(recent.entry)
        recent.entry = entry
        self._recent_by_key.add(entry)

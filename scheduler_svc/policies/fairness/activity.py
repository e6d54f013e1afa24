"""Which users of a band are active, and forgetting the idle ones, so a stream of one-off users costs
bounded memory: the part every fairness account shares.

A user is *idle* in a band when it has nothing queued there and nothing dispatched from there still
running. Its account says when an idle user's state may go (`safe_to_forget`); there are two rules:

- **safe rule**: forgetting cannot change a later decision (for the counter policies: its counter is at
  or below the floor that any returning user is lifted to anyway);
- **idle TTL**: the user's last event is `idle_user_ttl_seconds` old (0: this rule is off), long enough
  that pausing is no way for a heavy user to shed its debt.

Cost, amortised O(1) per event and never a full scan: the user an event is about is checked when it goes
idle, and each event checks `sweep_per_event` more known users in turn (a rotating sweep), so an idle user
is seen again within (known users / sweep_per_event) events. Time is the injected clock's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from itertools import islice

from attrs import define, field

from scheduler_svc.core.clock import Clock
from scheduler_svc.policies.interfaces import FlowView
from scheduler_svc.policies.weights import WeightResolver


@define(eq=False, slots=False)  # not slotted: tests set `pruning` on an instance
class UserActivity:
    """A band's active users: what each runs, when each was last seen, and who may be forgotten.

    The account gives its callbacks: whether an idle user may be forgotten by the safe rule, how to forget
    it (`expired`: by the TTL; False when some of it must stay until the TTL), what to drop when a user's
    (or a group's) last running request ends, and what to look at again of each user the sweep meets (a user
    whose queue emptied without an event, cancelled or expired, leaves the account's backlog order there)."""

    sweep_per_event = 2
    pruning = True  # tests turn it off to show that pruning changes no decision

    _weights: WeightResolver
    _clock: Clock
    _idle_ttl: float
    _safe_to_forget: Callable[[str], bool] = field(kw_only=True)
    _forget: Callable[[str, bool], bool] = field(kw_only=True)
    _all_ended: Callable[[str], None] = field(kw_only=True, default=lambda user: None)
    _group_all_ended: Callable[[str], None] = field(kw_only=True, default=lambda group: None)
    _refresh: Callable[[str], None] = field(kw_only=True, default=lambda user: None)
    flows: Mapping[str, FlowView] = field(init=False, factory=dict)  # the band's live backlogged flows (read-only)
    in_flight: dict[str, int] = field(init=False, factory=dict)  # user -> requests dispatched from this band, running
    group_in_flight: dict[str, int] = field(init=False, factory=dict)
    # user -> its last event; the sweep's order
    _last_seen: OrderedDict[str, float] = field(init=False, factory=OrderedDict)
    _members: dict[str, int] = field(init=False, factory=dict)  # group -> its users in `_last_seen`

    def tracked_users(self) -> int:
        """How many users any state is kept for (active ones, and idle ones not yet forgotten)."""
        return len(self._last_seen)

    def backlogged(self, user: str, flows: Mapping[str, FlowView]) -> None:
        self.flows = flows
        now = self._clock.now()
        self._touch(user, now)
        self._sweep(now)

    def dispatched(self, user: str) -> None:
        group = self._weights.group_of(user)
        self.in_flight[user] = self.in_flight.get(user, 0) + 1
        self.group_in_flight[group] = self.group_in_flight.get(group, 0) + 1
        now = self._clock.now()
        self._touch(user, now)
        self._sweep(now)

    def finished(self, user: str) -> None:
        self.ended(user)
        now = self._clock.now()
        if self.idle(user):
            self._try_forget(user, now)
        self._sweep(now)

    def ended(self, user: str) -> None:
        """One of the user's running requests ended or came back to the queue."""
        group = self._weights.group_of(user)
        left = self.in_flight.pop(user, 0) - 1
        if left > 0:
            self.in_flight[user] = left
        else:
            self._all_ended(user)
        left = self.group_in_flight.pop(group, 0) - 1
        if left > 0:
            self.group_in_flight[group] = left
        else:
            self._group_all_ended(group)
        self._touch(user, self._clock.now())

    def idle(self, user: str) -> bool:
        return user not in self.flows and user not in self.in_flight

    def is_last_member(self, user: str) -> bool:
        """Whether `user` is the only known user of its group."""
        return self._members.get(self._weights.group_of(user), 0) <= 1

    def _touch(self, user: str, now: float) -> None:
        if user not in self._last_seen:
            group = self._weights.group_of(user)
            self._members[group] = self._members.get(group, 0) + 1
        self._last_seen[user] = now
        self._last_seen.move_to_end(user)

    def _sweep(self, now: float) -> None:
        """Check the next few known users (bounded work) and forget those the rules allow."""
        if not self.pruning:
            return
        # the front of the sweep's order; each user checked goes to the back or is forgotten
        last_seen = self._last_seen
        for user in list(islice(last_seen, self.sweep_per_event)):
            if user in self.flows:  # backlogged: not idle, and its queue did not empty
                last_seen.move_to_end(user)
                continue
            self._refresh(user)  # what is looked at again is a queue that emptied
            if not self._try_forget(user, now):
                last_seen.move_to_end(user)

    def _try_forget(self, user: str, now: float) -> bool:
        """Forget what the rules allow of an idle user; True once nothing of it is left."""
        if not self.pruning or not self.idle(user):
            return False
        expired = self._idle_ttl > 0 and now - self._last_seen[user] >= self._idle_ttl
        if not expired and not self._safe_to_forget(user):
            return False
        if not self._forget(user, expired):
            return False
        del self._last_seen[user]
        group = self._weights.group_of(user)
        if self._members[group] > 1:
            self._members[group] -= 1
        else:
            del self._members[group]
        return True

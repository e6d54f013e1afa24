"""Counters: the account and chooser of the policies that serve the least-served user first (weighted round
robin, vtc, vtc_basic), in two levels: first the group with the smallest counter, then its user with the
smallest counter. What a unit of service costs is the policy's own (`Costing`), and a policy may count work
already committed to the engine (`Reservations`: vtc's look-ahead).

A flow that becomes backlogged has its counter lifted to the smallest counter among the backlogged (its
group's likewise; a group that finds the band empty, to the counter of the group whose dispatch emptied it,
as in the VTC paper), so idle time earns no credit and a returning user cannot monopolise the engine; it
does not go down, so briefly going idle does not wipe out what a user consumed. A user whose flow was empty
while its requests still ran was never idle: it is lifted only to the floor less the costing's credit per
running request (a bounded credit, so a trickle cannot bank a burst). Ties go to the flow that has been
backlogged longest (the order of the flows).

A dispatch charge stays *pending* until the request's first token: a failover refunds it, so the settled part
of a counter never goes down, and neither does the smallest settled counter among the backlogged. The account
keeps that floor (per shared group too), raised each time a choice looks at the backlog (`view`) and when the
band empties.

The key a choice compares (settled + pending + reserved, by user and by group) changes only through this
account's own events and, under `fairness_scope = "global"`, other bands' charges of the shared settled part
(the counters say so, `Counters.watch`); each change reaches the band's backlog order (`backlog_index`: the
users ordered by key, so a choice, a lift and a floor cost O(log n)) and the account's watchers (`watch`).

Pruning, safe rule: an idle group whose settled counter is at or below the floor is forgotten (with its
users), because any later return lifts it to at least that floor, which is what a forgotten group (counter
0) gets too. A user in a shared group is forgotten when its counter is at or below the group's floor. A user
alone in its group is compared with nobody, so its own counter never decides anything. Idle TTL: after
`idle_user_ttl_seconds` everything of the user goes, debt included.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from scheduler_svc.core.clock import Clock
from scheduler_svc.policies.cost import Counters, LocalCounters, Prices
from scheduler_svc.policies.fairness.activity import UserActivity
from scheduler_svc.policies.fairness.backlog_index import BacklogIndex
from scheduler_svc.policies.fairness.backlog_order import BacklogOrder, Choice
from scheduler_svc.policies.fairness.base import Eligible
from scheduler_svc.policies.interfaces import FlowView, RequestView
from scheduler_svc.policies.weights import WeightResolver

KeyWatcher = Callable[[str | None, str | None], None]
"""Told (user, group) whenever that user's or group's key may have changed (None: not that level; both
given: the user and its own group)."""


class Costing(Protocol):
    """What a policy charges for service, in its counter units."""

    def dispatch_cost(self, request: RequestView, prices: Prices) -> float:
        """What a dispatch costs before any token (pending until the first token)."""
        ...

    def token_cost(self, prices: Prices) -> float | None:
        """What one generated token costs as it streams (None: tokens are not charged)."""
        ...

    def credit_per_request(self, prices: Prices) -> float:
        """How far below the floor a returning user may stay per request it has running."""
        ...

    def counts_at(self, prices: Prices) -> bool:
        """Whether service at these prices charges anything: a costing in token prices charges nothing at
        prices of 0, and counters that stand still share nothing (the configuration refuses that model)."""
        ...


class Reservations(Protocol):
    """Work a user's running requests have committed the engine to and not yet been charged for, counted
    in its key (vtc's look-ahead). Its events come in the account's order."""

    def user(self, user: str) -> float | None:
        """The user's reserved cost (None: none)."""
        ...

    def group(self, group: str) -> float | None: ...

    def dispatched(self, request: RequestView) -> None: ...

    def generated(self, request: RequestView, tokens: int) -> None: ...

    def released(self, request: RequestView) -> None:
        """The request no longer runs: what it was still expected to generate stops counting."""
        ...

    def finished(self, request: RequestView, generated: int) -> None:
        """The request, which an engine answered, ended after generating `generated` tokens (after
        `released`)."""
        ...

    def all_ended(self, user: str) -> None: ...

    def group_all_ended(self, group: str) -> None: ...

    def forget(self, user: str, expired: bool) -> bool:
        """Drop the idle user's state; False when some of it must stay until the idle TTL."""
        ...


@dataclass(slots=True)
class CounterView:
    """What a least-served choice reads: the backlogged flows and the account's keys (read-only)."""

    flows: Mapping[str, FlowView]
    account: CounterAccount

    def recent_ends(self) -> Mapping[str, float]:
        """User -> when its last request ended, for users a choice may wait for (see `LeastServed`)."""
        return self.account.ended_at


class CounterAccount:
    """The service of one band's users and groups in counter units (see the module docstring)."""

    def __init__(
        self,
        weights: WeightResolver,
        clock: Clock,
        idle_ttl: float,
        costing: Costing,
        *,
        reservations: Reservations | None = None,
        return_grace: float = 0.0,
    ) -> None:
        self.weights = weights
        self._clock = clock
        self._costing = costing
        self._reserved = reservations
        self.return_grace = return_grace  # how long a choice waits for a user whose request just ended (0: never)
        self.activity = UserActivity(
            weights,
            clock,
            idle_ttl,
            safe_to_forget=self._safe_to_forget,
            forget=self._forget,
            all_ended=self._all_ended,
            group_all_ended=self._group_all_ended,
            refresh=self._refresh,
        )
        self.prices = Prices()
        # settled: charges of started requests, and lifts (the band's own, or a class-wide spend: cost.py)
        self._users: Counters = LocalCounters()
        self._groups: Counters = LocalCounters()
        self._user_pending: dict[str, float] = {}  # charges of dispatched requests before their first token
        self._group_pending: dict[str, float] = {}
        self._pending: dict[str, float] = {}  # request id -> its pending charge
        self._floor = 0.0  # no group is lifted below this again
        self._member_floor: dict[str, float] = {}  # shared group -> no user of it is lifted below this again
        self._last_group: str | None = None  # the group whose dispatch left the band empty
        # user -> when its last request ended, for the return grace, of the users that return promptly; oldest
        # first (what a choice may wait for)
        self.ended_at: OrderedDict[str, float] = OrderedDict()
        # every user's last end within the grace, oldest first, and the users whose latest return to the band
        # came within the grace after an end: closed-loop clients, the only ones a choice waits for
        self._recent_ends: OrderedDict[str, float] = OrderedDict()
        self.returns_promptly: set[str] = set()
        self._watchers: list[KeyWatcher] = []
        self.order: BacklogOrder = BacklogIndex()  # `use_order` answers from another (the scan, a check)
        self.order.attach(self)

    def use_order(self, order: BacklogOrder) -> None:
        """Answer the backlog's questions from `order` from now on (before any event)."""
        self.order = order
        order.attach(self)

    def use_reservations(self, reservations: Reservations) -> None:
        """Count `reservations` in the keys from now on (before any event)."""
        self._reserved = reservations

    def watch(self, watcher: KeyWatcher) -> None:
        """Tell `watcher` of every change of a user's or group's key from now on."""
        self._watchers.append(watcher)

    def _moved(self, user: str | None, group: str | None) -> None:
        self.order.moved(user, group)
        for watcher in self._watchers:
            watcher(user, group)

    def _refresh(self, user: str) -> None:
        self.order.refresh(user)

    # -- what a choice reads -------------------------------------------------------------------------------
    def view(self, flows: Mapping[str, FlowView]) -> CounterView:
        """The floors are raised to the least settled counters among the backlogged, as this choice sees them
        (every backlogged user counts, whichever can go now)."""
        self.activity.flows = flows
        assert flows, "a choice needs at least one backlogged flow"
        self.order.seen(flows)
        band_floor, member_floor = self.order.floors()
        self._floor = max(self._floor, band_floor)
        for group, floor in member_floor.items():
            self._member_floor[group] = max(self._member_floor.get(group, 0.0), floor)
        return CounterView(flows, self)

    def took_turn(self, user: str) -> None:
        return None  # the dispatch that follows is what counts

    def user_key(self, user: str) -> float:
        key = self._users.value(user) + self._user_pending.get(user, 0.0)
        if self._reserved is not None and (reserved := self._reserved.user(user)) is not None:
            key += reserved
        return key

    def group_key(self, group: str) -> float:
        key = self._groups.value(group) + self._group_pending.get(group, 0.0)
        if self._reserved is not None and (reserved := self._reserved.group(group)) is not None:
            key += reserved
        return key

    def user_settled(self, user: str) -> float:
        """The user's settled counter: what a peer becoming backlogged is lifted to."""
        return self._users.value(user)

    def group_settled(self, group: str) -> float:
        return self._groups.value(group)

    def forget_ended(self, users: list[str]) -> None:
        """These users' return grace is over."""
        for user in users:
            del self.ended_at[user]
            self.order.forgot_ended(user)

    # -- service -------------------------------------------------------------------------------------------
    def counts_at(self, prices: Prices) -> bool:
        return self._costing.counts_at(prices)

    def use_costing(self, prices: Prices, users: Counters, groups: Counters) -> None:
        self.prices = prices
        self._users, self._groups = users, groups
        users.watch(lambda user: self._moved(user, None))  # other bands' charges of a shared spend
        groups.watch(lambda group: self._moved(None, group))

    def on_backlogged(self, user: str, flows: Mapping[str, FlowView]) -> None:
        self.activity.flows = flows
        if self.return_grace > 0:
            self._learn_return(user)
        self.order.backlogged(user, flows)
        group = self.weights.group_of(user)
        peer_floor = self.order.peer_floor(user, group)
        if peer_floor is not None:  # users are compared only within their group
            self._users.lift(user, peer_floor - self._running_credit(user))
        else:  # the group just became backlogged
            if group in self._member_floor:
                self._users.lift(user, self._member_floor[group])
            others_floor = self.order.other_groups_floor(user, group)
            if others_floor is not None:
                floor = others_floor - self._group_running_credit(group)
            else:
                floor = self._band_floor()
                self._last_group = None
            self._groups.lift(group, floor)
        self._moved(user, group)
        self.activity.backlogged(user, flows)

    def on_dispatched(self, request: RequestView) -> None:
        cost = self._costing.dispatch_cost(request, self.prices)
        self._pending[request.request_id] = cost
        user, group = request.user, self.weights.group_of(request.user)
        self._user_pending[user] = self._user_pending.get(user, 0.0) + cost / self.weights.user_weight(user)
        self._group_pending[group] = self._group_pending.get(group, 0.0) + cost / self.weights.group_weight(group)
        if not self.activity.flows:  # it took the band's last queued request
            self._last_group = group
        self.activity.dispatched(user)
        if self._reserved is not None:
            self._reserved.dispatched(request)
        self._moved(user, group)

    def on_generated(self, request: RequestView, tokens: int) -> None:
        self._unpend(request, settle=True)
        if (token_cost := self._costing.token_cost(self.prices)) is not None:
            self._charge(request.user, token_cost * tokens)
        if self._reserved is not None:
            self._reserved.generated(request, tokens)
        self._moved(request.user, self.weights.group_of(request.user))

    def on_finished(self, request: RequestView, generated: int, *, reached_engine: bool = True) -> None:
        if self._reserved is not None:
            self._reserved.released(request)
            if reached_engine:  # one that never reached an engine says nothing about its user's answers
                self._reserved.finished(request, generated)
        self._unpend(request, settle=reached_engine)
        if self.return_grace > 0:
            self._ended(request.user)
        self.activity.finished(request.user)  # may drop what only running requests need: keys move after it
        self._moved(request.user, self.weights.group_of(request.user))

    def on_requeued(self, request: RequestView) -> None:
        if self._reserved is not None:
            self._reserved.released(request)
        self._unpend(request, settle=False)
        self.activity.ended(request.user)
        self._moved(request.user, self.weights.group_of(request.user))

    def counters(self) -> dict[str, float]:
        users = self._users.keys() | self._user_pending.keys()
        if self._users.shared:  # a backlogged user's spend may come from other bands only
            users |= set(self.activity.flows)
        return {user: self.user_key(user) for user in users}

    def tracked_users(self) -> int:
        return self.activity.tracked_users()

    # -- bookkeeping ---------------------------------------------------------------------------------------
    def _ended(self, user: str) -> None:
        """A request of the user ended: a choice may wait for its return if it returned promptly last time."""
        now = self._clock.now()
        self._drop_old_ends(now)
        self._recent_ends.pop(user, None)
        self._recent_ends[user] = now
        if user in self.returns_promptly:
            self.ended_at.pop(user, None)
            self.ended_at[user] = now
            self.order.ended(user)

    def _learn_return(self, user: str) -> None:
        """The user's flow fills again: if within the grace after one of its requests ended, it is a client
        that returns promptly (closed loop: the next request right after an answer)."""
        now = self._clock.now()
        ended = self._recent_ends.pop(user, None)
        if ended is not None:
            if now < ended + self.return_grace:
                self.returns_promptly.add(user)
            else:
                self.returns_promptly.discard(user)
        self._drop_old_ends(now)

    def _drop_old_ends(self, now: float) -> None:
        """Ends whose grace is over: a user that let it pass with nothing queued did not return promptly, and
        choices stop waiting for it (waiting for a client that returns at random, an open-loop one like most
        of a large population, holds a slot idle for nothing)."""
        ends = self._recent_ends
        flows = self.activity.flows
        while ends:
            user, ended = next(iter(ends.items()))
            if now < ended + self.return_grace:
                break
            del ends[user]
            if user not in flows:
                self.returns_promptly.discard(user)

    def _unpend(self, request: RequestView, settle: bool) -> None:
        """The request's pending charge is settled (first token, or it ended) or refunded (failover)."""
        cost = self._pending.pop(request.request_id, None)
        if cost is None:
            return
        user, group = request.user, self.weights.group_of(request.user)
        self._user_pending[user] = self._user_pending.get(user, 0.0) - cost / self.weights.user_weight(user)
        self._group_pending[group] = self._group_pending.get(group, 0.0) - cost / self.weights.group_weight(group)
        if settle:
            self._charge(user, cost)

    def _charge(self, user: str, cost: float) -> None:
        group = self.weights.group_of(user)
        self._users.charge(user, cost / self.weights.user_weight(user))
        self._groups.charge(group, cost / self.weights.group_weight(group))

    def _running_credit(self, user: str) -> float:
        """How far below the floor a user whose flow was empty only while its requests ran may stay: it was
        never idle, so what it is owed is not idle credit, but at most the costing's credit per request it
        has running (so a trickle of requests cannot bank an unbounded burst)."""
        credit = self._costing.credit_per_request(self.prices)
        return credit * self.activity.in_flight.get(user, 0) / self.weights.user_weight(user)

    def _group_running_credit(self, group: str) -> float:
        credit = self._costing.credit_per_request(self.prices)
        return credit * self.activity.group_in_flight.get(group, 0) / self.weights.group_weight(group)

    def _band_floor(self) -> float:
        """The least any group becoming backlogged from now on is lifted to. While `_last_group` is set the
        band is empty (the next group to arrive clears it), and a group arriving then is lifted to it."""
        if self._last_group is not None:
            self._floor = max(self._floor, self._groups.value(self._last_group))
        return self._floor

    def _all_ended(self, user: str) -> None:
        """The user has nothing running any more: drop what only running requests need (exactly, so no
        rounding residue is left that a forgotten user would not have)."""
        self._user_pending.pop(user, None)
        if self._reserved is not None:
            self._reserved.all_ended(user)

    def _group_all_ended(self, group: str) -> None:
        self._group_pending.pop(group, None)
        if self._reserved is not None:
            self._reserved.group_all_ended(group)

    def _safe_to_forget(self, user: str) -> bool:
        if self._users.shared:  # its spend counts in the class's other bands: only the idle TTL drops it
            return False
        if user in self.ended_at and self._clock.now() < self.ended_at[user] + self.return_grace:
            return False  # a choice may still wait for it
        group = self.weights.group_of(user)
        if self.weights.is_shared(group):
            if self._users.value(user) > self._member_floor.get(group, 0.0):
                return False
            if not self.activity.is_last_member(user):
                return True
        return self._groups.value(group) <= self._band_floor()

    def _forget(self, user: str, expired: bool) -> bool:
        self._users.forget(user)
        self._recent_ends.pop(user, None)
        self.returns_promptly.discard(user)
        if self.ended_at.pop(user, None) is not None:
            self.order.forgot_ended(user)
        group = self.weights.group_of(user)
        if self.activity.is_last_member(user):  # nothing of the group is left: a uniform shift of its users
            if group == self._last_group:
                self._band_floor()  # its counter is the floor of an empty band: keep that
                self._last_group = None
            self._groups.forget(group)
            self._member_floor.pop(group, None)
        self._moved(user, group)
        if self._reserved is not None:
            return self._reserved.forget(user, expired)
        return True


class LeastServed:
    """The counter policies' chooser: the eligible group with the smallest key, then its eligible user with
    the smallest key (the longest backlogged on ties), read from the account's backlog order.

    Returning users (`CounterAccount.return_grace`): a user whose request ended less than the grace ago, that
    is behind the user this choice would pick, and that came back within the grace last time is about to
    return (a closed-loop client sends its next request right after an answer); the choice then waits for
    it, at most the grace (`wake_at` says when to choose again). Without this the dispatch that the ending
    itself triggers always beats the user's next request, and a slot goes to whoever is ahead."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._hold_until: float | None = None

    def select(self, view: CounterView, eligible: Eligible | None) -> str | None:
        choice = view.account.order.least_served(eligible)
        if choice is None:
            return None
        if view.recent_ends() and self._returning_first(view, choice):
            return None
        return choice.user

    def _returning_first(self, view: CounterView, choice: Choice) -> bool:
        """Whether a user about to return is behind the choice (see the class docstring)."""
        account = view.account
        self._hold_until = account.order.returning_hold(choice, self._clock.now(), account.return_grace)
        return self._hold_until is not None

    def wake_at(self) -> float | None:
        """When a choice that waited for a returning user should be made again (None: not waiting). A wait
        whose time has come is over, whether or not the band's choice was made again since: the band may
        have emptied, or its gate closed, and a wait kept past its time would ask the loop to pass again at
        once, and again after each pass, until the next choice for the band."""
        if self._hold_until is not None and self._hold_until <= self._clock.now():
            self._hold_until = None
        return self._hold_until

    def offer(self, view: CounterView, eligible: Eligible | None, bound: float, limit: int) -> list[str]:
        """D-LPM's candidates: `select`'s choice, then every eligible user whose group's key is within `bound`
        of the smallest eligible group's and whose own key is within `bound` of the smallest eligible one of
        its group.

        Fairness bound: whatever the caller sends among these, every request goes to a user whose counters
        are within `bound` of the least served eligible user's (at each level), so two users backlogged and
        eligible throughout never drift apart by more than `bound` + the largest single charge (VTC's own
        bound, `bound = 0`): the gap can grow only by a dispatch to the user ahead, which needs it to be at
        most `bound` ahead. `tests/unit/test_locality_fairness.py` checks it under Hypothesis."""
        chosen = self.select(view, eligible)
        if chosen is None or bound <= 0 or limit <= 1:
            return [] if chosen is None else [chosen]
        return view.account.order.within(chosen, eligible, bound, limit)

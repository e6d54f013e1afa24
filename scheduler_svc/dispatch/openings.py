"""Which backends' gates admit one more request now: engine priorities, drains, cooldowns, gate decisions.

For one model, `BackendGates` asks every backend's gate about a candidate (its class, the class whose gate
it goes under, its user) with inputs from the backend's load estimator; a backend that is draining, or
cooling down after a failover, is left out. The backend policy then picks among the open ones. The same
evaluation, for every class and a user with nothing at the engines, is what introspection shows (`states`).

Answers are kept between passes (`open_sets`): a gate is asked again only when something happened at its
backend (a reading, a request sent or ended, a cooldown) or its answer's time is up; a drain, or a reload
that changes the backends or their gates, starts afresh (`backends_changed`). At a priority engine the
answer depends on the user only through the engine priority its request would carry there, that is through
how many requests it has in flight there: a user with none anywhere gets the kept answer, and one with some
gets it patched at those backends only (`users_in_flight` knows where each user has requests, so telling
them apart costs nothing per backend).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from scheduler_svc.config import PriorityClassConfig
from scheduler_svc.dispatch.activity import ClassActivity
from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.dispatch.gate_history import GateHistory
from scheduler_svc.dispatch.metrics import BackendSeries
from scheduler_svc.dispatch.open_sets import EARLY, Answer, Opening, OpenSet
from scheduler_svc.dispatch.steering import LOCAL, DispatchAuthority
from scheduler_svc.policies import GateCause, GateDecision, GateInputs

__all__ = ["BackendChoice", "BackendGates", "BackendState", "EnginePriorities", "Opening"]

UserKey = tuple[tuple[int, int], ...]
"""Where a user has requests in flight at a priority engine: (backend index, how many), by index; () for
a user with none, whose request carries its class's own engine priority everywhere."""

_QuestionKey = tuple[str, str, bool, float]  # (gate class, request class, better class active, its TPOT limit)


def _left_out(handle: BackendHandle, now: float) -> GateCause | None:
    """Why the backend is not asked at all (it drains, or cools down after a failover); None: its gate decides."""
    if handle.draining:
        return GateCause.DRAINING
    if handle.cooling_for(now):
        return GateCause.COOLING_DOWN
    return None


@dataclass(frozen=True)
class BackendState:
    """A backend's gate state for one class, for introspection."""

    name: str
    priority_class: str
    decision: GateDecision
    inputs: GateInputs


class EnginePriorities:
    """The engine priority a request carries to a priority engine (lower is served first): its class's
    `engine_priority`, worsened by `engine_priority_per_inflight` for each request its user already has
    at that engine, so a user's second and third requests queue behind other users' first ones."""

    def __init__(self, classes: Mapping[str, PriorityClassConfig], per_inflight: int) -> None:
        self._classes = classes
        self.per_inflight = per_inflight

    def at(self, priority_class: str, in_flight: int) -> int:
        """For a request of this class whose user has `in_flight` requests at the engine already."""
        return self._classes[priority_class].engine_priority + self.per_inflight * in_flight

    def of(self, priority_class: str, user: str | None, handle: BackendHandle) -> int | None:
        """For a request of this class and user (None: a user with nothing there); None when the backend
        takes no priorities."""
        if not handle.sends_priority:
            return None
        return self.at(priority_class, handle.estimator.user_in_flight.get(user, 0) if user is not None else 0)


class BackendGates:
    """Every backend's gate for one model, with their answers kept between passes."""

    def __init__(
        self,
        backends: Sequence[BackendHandle],
        activity: ClassActivity,
        priorities: EnginePriorities,
        series: Mapping[str, BackendSeries],
        history: GateHistory | None = None,
    ) -> None:
        self.backends = list(backends)  # a reload changes it in place, then calls `backends_changed`
        self._activity = activity
        self.priorities = priorities
        self._series = series
        self._history = history  # with tracing on: each band-level change, for traced queue waits
        self._authority: DispatchAuthority = LOCAL  # its in-flight cap closes a backend like a gate would
        # the handles whose events reach `_event`, by id; holding each keeps its id from going to a later one
        self._watched: dict[int, BackendHandle] = {}
        # (when, tiebreak, handle): failover cooldowns as they were set; one no longer the handle's is skipped
        self._cooldowns: list[tuple[float, int, BackendHandle]] = []
        self._cooldown_order = itertools.count()
        self.backends_changed()

    def backends_changed(self) -> None:
        """The backends, their order, their gates or their drains changed: forget every kept answer and
        index the backends afresh."""
        self._index = {h.name: i for i, h in enumerate(self.backends)}
        self._revision = [0] * len(self.backends)  # bumped by every event at the backend
        self._volatile = frozenset(i for i, h in enumerate(self.backends) if not hasattr(h.gate, "revision"))
        self._sets: dict[_QuestionKey, OpenSet] = {}
        # question -> (backend, engine priority) -> (revision, time up, opening): the answers for users with
        # requests in flight there
        self._patches: dict[_QuestionKey, dict[tuple[int, int], tuple[int, float | None, Opening | None]]] = {}
        self.users_in_flight: dict[str, dict[int, int]] = {}  # user -> {priority backend: its requests there}
        for i, handle in enumerate(self.backends):
            if handle.sends_priority:
                for user, count in handle.estimator.user_in_flight.items():
                    self._user_count(i, user, count)
            if id(handle) not in self._watched:
                self._watched[id(handle)] = handle
                handle.estimator.watch(partial(self._event, handle), partial(self._user_event, handle))
                handle.watch_cooling(partial(self._cooling_set, handle))

    def _position(self, handle: BackendHandle) -> int | None:
        index = self._index.get(handle.name)
        return index if index is not None and self.backends[index] is handle else None

    def _event(self, handle: BackendHandle) -> None:
        if (index := self._position(handle)) is not None:
            self._touch(index)

    def _cooling_set(self, handle: BackendHandle) -> None:
        heapq.heappush(self._cooldowns, (handle.cool_until, next(self._cooldown_order), handle))
        self._event(handle)

    def cooldown_end(self, now: float) -> float | None:
        """When the next failover cooldown ends after `now`, None when no backend cools down: its gate may open
        then by time alone, which no event marks (a pass must be made then)."""
        cooldowns = self._cooldowns
        while cooldowns and (cooldowns[0][0] <= now or cooldowns[0][2].cool_until != cooldowns[0][0]):
            heapq.heappop(cooldowns)
        return cooldowns[0][0] if cooldowns else None

    def _user_event(self, handle: BackendHandle, user: str, count: int) -> None:
        if handle.sends_priority and (index := self._position(handle)) is not None:
            self._user_count(index, user, count)

    @property
    def authority(self) -> DispatchAuthority:
        """Who decides when requests go; its in-flight cap per backend closes a backend like a gate would."""
        return self._authority

    def steer(self, authority: DispatchAuthority) -> None:
        self._authority = authority
        for i in range(len(self.backends)):
            self._touch(i)

    def _touch(self, index: int) -> None:
        self._revision[index] += 1
        for kept in self._sets.values():
            kept.touch(index)

    def _user_count(self, index: int, user: str, count: int) -> None:
        where = self.users_in_flight.get(user)
        if count:
            if where is None:
                where = self.users_in_flight[user] = {}
            where[index] = count
        elif where is not None:
            where.pop(index, None)
            if not where:
                del self.users_in_flight[user]

    def _where(self, user: str | None) -> dict[int, int] | None:
        """Where `user`'s requests in flight worsen its engine priority (None: nowhere)."""
        if user is None or self.priorities.per_inflight == 0:
            return None
        return self.users_in_flight.get(user)

    def user_key(self, user: str | None) -> UserKey:
        """What the answer for `user` depends on beyond the question (see `UserKey`)."""
        where = self._where(user)
        return tuple(sorted(where.items())) if where else ()

    def _capped(self, handle: BackendHandle) -> GateDecision | None:
        """A closed decision when the authority's in-flight cap is reached at `handle` (a replica gating
        alone while the cluster store is unreachable), else None."""
        cap = self._authority.in_flight_cap(handle)
        if cap is None or handle.estimator.in_flight < cap:
            return None
        return GateDecision(
            False, f"in flight {handle.estimator.in_flight} >= degraded cap {cap}", True, GateCause.OTHER
        )

    def open(
        self, gate_class: PriorityClassConfig, request_class: PriorityClassConfig, user: str | None, now: float
    ) -> list[Opening]:
        """The backends whose gate (for `gate_class`) admits one more request of `request_class` from `user`
        (None or one with nothing in flight: the class's own engine priority, the answer the gauges show),
        in config order. At a priority engine the answer depends on the user: its request queues behind only
        what the engine would serve first (see `check_waiting`)."""
        question = self._question(gate_class, request_class, now)
        kept = self._kept(question, gate_class, request_class, now)
        where = self._where(user)
        if not where:
            return list(kept)
        patched = dict(self._answers_for(question, gate_class, request_class, user, where, now))
        merged: list[Opening] = []
        pending = iter(sorted(patched))  # the user's backends, in config order, merged into the kept answers
        next_patched = next(pending, None)
        for opening in kept:
            index = self._index[opening.name]
            while next_patched is not None and next_patched < index:
                if (extra := patched[next_patched]) is not None:
                    merged.append(extra)
                next_patched = next(pending, None)
            if next_patched == index:
                if (replaced := patched[index]) is not None:
                    merged.append(replaced)
                next_patched = next(pending, None)
            else:
                merged.append(opening)
        while next_patched is not None:
            if (extra := patched[next_patched]) is not None:
                merged.append(extra)
            next_patched = next(pending, None)
        return merged

    def any_open(
        self, gate_class: PriorityClassConfig, request_class: PriorityClassConfig, user: str | None, now: float
    ) -> bool:
        """Whether `open` would name any backend (without building its list): at once when a kept open
        backend holds nothing of the user's, else from the user's own answers, stopping at the first open."""
        question = self._question(gate_class, request_class, now)
        kept = self._kept(question, gate_class, request_class, now)
        where = self._where(user)
        if not where:
            return bool(kept)
        kept_set = self._sets[question]
        if len(kept) > len(where) or not kept_set.open_indexes.issubset(where):
            return True  # a backend open to a user with nothing there holds nothing of this one's
        if self.priorities.per_inflight >= 0:  # where each bound is known, the user's priority alone decides
            at, cls, bounds = self.priorities.at, request_class.name, kept_set.bounds
            if any(at(cls, count) < bounds[i] for i, count in where.items()):
                return True
            where = {i: count for i, count in where.items() if i in kept_set.unbounded}
        return any(
            opening is not None
            for _, opening in self._answers_for(question, gate_class, request_class, user, where, now)
        )

    def _answers_for(
        self,
        question: _QuestionKey,
        gate_class: PriorityClassConfig,
        request_class: PriorityClassConfig,
        user: str | None,
        where: Mapping[int, int],
        now: float,
    ) -> Iterator[tuple[int, Opening | None]]:
        """The answers at the backends where `user` has requests in flight (at priority engines): each kept
        per (question, backend, engine priority) until an event there or its time is up. Where the kept
        answer for the class's own priority says up to which priority it holds (`PriorityBoundGate`), a
        worse priority at or past that bound is closed without asking."""
        patches = self._patches.get(question)
        if patches is None:
            patches = self._patches[question] = {}
        at, cls, per = self.priorities.at, request_class.name, self.priorities.per_inflight
        answers = self._sets[question].answers
        revisions = self._revision
        for index, count in where.items():
            priority = at(cls, count)
            answer = answers[index]
            if answer is not None and answer.admits_below is not None and per >= 0 and priority >= answer.admits_below:
                yield index, None
                continue
            key = (index, priority)
            kept = patches.get(key)
            if (
                kept is not None
                and kept[0] == revisions[index]
                and (kept[1] is None or now < kept[1] - EARLY)
                and index not in self._volatile
            ):
                yield index, kept[2]
                continue
            revision = revisions[index]
            asked = self._ask(gate_class, request_class, question, now, index, user)
            patches[key] = (revision, asked.until, asked.opening)
            yield index, asked.opening

    def _question(
        self, gate_class: PriorityClassConfig, request_class: PriorityClassConfig, now: float
    ) -> _QuestionKey:
        activity = self._activity
        return (
            gate_class.name,
            request_class.name,
            activity.better_active(gate_class, now),
            activity.better_tpot_limit(gate_class, now),
        )

    def _kept(
        self, question: _QuestionKey, gate_class: PriorityClassConfig, request_class: PriorityClassConfig, now: float
    ) -> list[Opening]:
        """The kept answers to `question` for a user with nothing in flight, brought up to date."""
        kept = self._sets.get(question)
        if kept is None:
            kept = self._sets[question] = OpenSet(self.backends, self._volatile)
        return kept.look(now, partial(self._ask, gate_class, request_class, question, now))

    def _ask(
        self,
        gate_class: PriorityClassConfig,
        request_class: PriorityClassConfig,
        question: _QuestionKey,
        now: float,
        index: int,
        user: str | None = None,
    ) -> Answer:
        """Ask backend `index`'s gate now (the gauges show the answer for a user with nothing in flight)."""
        handle = self.backends[index]
        series = self._series[handle.name] if user is None else None
        left_out = _left_out(handle, now)
        if left_out is not None:
            if series is not None:
                series.show_left_out()
                if causes := series.gate_causes.get(gate_class.name):
                    causes.show(left_out)
                if self._history is not None:
                    self._history.saw(gate_class.name, handle.name, left_out, now)
            # a drain ends by an event here (`backends_changed`), a cooldown by itself
            until = now + handle.cooling_for(now) if left_out is GateCause.COOLING_DOWN else None
            return Answer(None, until, -math.inf)
        priority = self.priorities.of(request_class.name, user, handle)
        _, _, better_active, better_tpot = question
        inputs = handle.estimator.gate_inputs(
            now, better_active, better_tpot_limit=better_tpot, candidate_priority=priority, holding_work=True
        )
        gate = handle.gate
        learned = getattr(gate, "revision", None)
        capped = self._capped(handle)
        decision = capped or gate.decide(inputs, gate_class)
        if series is not None:
            series.show_gate(decision.open, decision.fresh, inputs.estimated_waiting())
            cause = GateCause.OPEN if decision.open else decision.cause
            if causes := series.gate_causes.get(gate_class.name):
                causes.show(cause)
            if self._history is not None:
                self._history.saw(gate_class.name, handle.name, cause, now)
        until = gate.expires(inputs, decision) if learned is not None else None  # type: ignore[attr-defined]
        if learned is not None and getattr(gate, "revision", None) != learned:
            self._touch(index)  # it learned: its later answers may differ, this one stands
        admits_below: float | None = None
        if capped is not None:
            admits_below = -math.inf  # the authority's cap holds whatever the priority
        elif priority is not None and learned is not None and hasattr(gate, "admits_below"):
            admits_below = gate.admits_below(inputs, decision, gate_class)
        return Answer(Opening(handle, inputs) if decision.open else None, until, admits_below)

    def states(self, classes: Sequence[PriorityClassConfig], now: float) -> list[BackendState]:
        """Every backend's gate decision for every class, with its inputs, for a request from a user with
        nothing at the engine (at a priority engine a user with requests there may find the gate closed)."""
        states = []
        for handle in self.backends:
            for cls in classes:
                inputs = handle.estimator.gate_inputs(
                    now,
                    self._activity.better_active(cls, now),
                    better_tpot_limit=self._activity.better_tpot_limit(cls, now),
                    candidate_priority=self.priorities.of(cls.name, None, handle),
                )
                decision = self._capped(handle) or handle.gate.decide(inputs, cls)
                if handle.draining:
                    why = ", ".join(sorted(handle.drains))
                    reason = f"draining ({why}): no new requests, running ones finish ({decision.reason})"
                    decision = GateDecision(False, reason, decision.fresh, GateCause.DRAINING)
                elif cooling := handle.cooling_for(now):
                    reason = f"cooling down {cooling:.1f}s after failing a request ({decision.reason})"
                    decision = GateDecision(False, reason, decision.fresh, GateCause.COOLING_DOWN)
                states.append(BackendState(handle.name, cls.name, decision, inputs))
        return states


class BackendChoice:
    """Which backends can take a request of one band now, per user, within one dispatch.

    At a priority engine whether a request may go depends on its engine priority (`EnginePriorities`), and
    only on that: users whose requests would carry the same priorities get the same answer, so each
    distinct answer is worked out once per dispatch, however many users the band holds, and telling which
    answer a user gets costs nothing per backend (`BackendGates.user_key`).
    """

    def __init__(
        self, gates: BackendGates, gate_class: PriorityClassConfig, request_class: PriorityClassConfig, now: float
    ) -> None:
        self._gates = gates
        self._gate_class = gate_class
        self._request_class = request_class
        self._now = now
        self._answers: dict[UserKey, list[Opening]] = {}
        self._eligible: dict[UserKey, bool] = {}

    def for_user(self, user: str) -> list[Opening]:
        """The backends `user`'s next request may go to now (empty: no gate admits it)."""
        key = self._gates.user_key(user)
        if key not in self._answers:
            self._answers[key] = self._gates.open(self._gate_class, self._request_class, user, self._now)
        return self._answers[key]

    def eligible(self, user: str | None) -> bool:
        """Whether some backend can take `user`'s next request now (the fairness policy's filter; None: a
        user with nothing in flight). For such a user the open backends are the kept answer itself, so they
        are taken whole, once, for `for_user` to reuse; for another, `any_open` stops at the first open."""
        key = self._gates.user_key(user)
        answer = self._eligible.get(key)
        if answer is None:
            if key in self._answers:
                answer = bool(self._answers[key])
            elif not key:
                answers = self._answers[key] = self._gates.open(self._gate_class, self._request_class, None, self._now)
                answer = bool(answers)
            else:
                answer = self._gates.any_open(self._gate_class, self._request_class, user, self._now)
            self._eligible[key] = answer
        return answer

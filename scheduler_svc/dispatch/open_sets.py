"""Gate answers kept between decision passes, so a pass asks again only the gates something happened to.

A gate's answer for a backend rests on the backend's load estimate, on what the gate learned, on its
cooldown, and on the clock only through a reading going stale (`ReusableGate`). Each of those changes
through an event at that backend: a request sent, accepted, started or ended there, a reading, a
cooldown. So an `OpenSet` keeps, for one question (the gate's class, the request's class, the better
classes' activity), each backend's last answer to a request carrying the class's own engine priority
(a user with nothing in flight there), and asks a backend's gate again only when it was told of an event
there (`touch`), when a kept answer's time is up (a reading going stale, a cooldown ending), or always for
a gate that does not declare itself reusable. A pass then costs O(backends something happened to), not
O(backends), and the answers are exactly those asking every gate would give: a gate asked twice about the
same inputs and revision answers the same.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.policies import GateInputs
from scheduler_svc.policies.backend_choice import load_of

# A kept answer is asked again this long before its time is up, so that rounding in the time it gives can
# never keep an answer past the moment the gate would decide otherwise (asking early answers the same).
EARLY = 1e-6

Evaluate = Callable[[int], "Answer"]
"""Asks backend i's gate now."""


@dataclass(slots=True)
class Opening:
    """A backend whose gate admits the candidate now, with the inputs its gate saw and the load order the
    backend policies sort by (`backend_choice.load_order`), worked out once, when first asked. Read-only
    once built (not frozen: one is built for every gate asked, and a frozen build costs twice as much)."""

    handle: BackendHandle
    inputs: GateInputs
    _load: tuple[int, int, int] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def load(self) -> tuple[int, int, int]:
        if self._load is None:
            self._load = load_of(self.inputs)
        return self._load

    @property
    def name(self) -> str:
        return self.handle.name


@dataclass(slots=True)
class Answer:
    """A gate's answer for a candidate with the class's own engine priority (read-only once built)."""

    opening: Opening | None  # None: closed
    until: float | None  # when it may change by itself (None: not before an event at the backend)
    admits_below: float | None  # at a priority engine, the worse priorities it holds for (`PriorityBoundGate`)


class OpenSet:
    """Every backend's kept answer to one question, and the open ones in configuration order."""

    def __init__(self, backends: Sequence[BackendHandle], volatile: frozenset[int]) -> None:
        self._count = len(backends)
        self._volatile = volatile  # backends whose gate is not reusable: asked at every look
        self.answers: list[Answer | None] = [None] * self._count  # read-only for callers
        self._dirty: set[int] = set(range(self._count))
        self._timers: list[tuple[float, int]] = []  # (when a kept answer's time is up, backend), a heap
        self._due: list[float | None] = [None] * self._count  # each backend's live entry there (older ones: skipped)
        self._open: list[Opening] = []
        self._open_order: list[int] = []  # the backend of each entry of `_open`, ascending
        self.open_indexes: set[int] = set()  # read-only for callers
        # per backend, the worse priorities its answer holds for (`Answer.admits_below`); the backends without
        # such a bound apart (read-only for callers)
        self.bounds: list[float] = [-math.inf] * self._count
        self.unbounded: set[int] = set(range(self._count))

    def touch(self, index: int) -> None:
        """Something happened at backend `index`: ask its gate again at the next look."""
        self._dirty.add(index)

    def look(self, now: float, evaluate: Evaluate) -> list[Opening]:
        """The open backends now, in configuration order (the list is shared: do not change it)."""
        timers = self._timers
        while timers and timers[0][0] <= now:
            when, index = heapq.heappop(timers)
            if self._due[index] == when:  # the time of the answer kept now, not of one it replaced
                self._due[index] = None
                self._dirty.add(index)
        if self._volatile:
            self._dirty |= self._volatile
        if not self._dirty:
            return self._open
        todo = sorted(self._dirty)
        self._dirty = set()
        for index in todo:
            answer = evaluate(index)
            self.answers[index] = answer
            due = None if answer.until is None else answer.until - EARLY
            if due != self._due[index]:
                self._due[index] = due
                if due is not None:
                    heapq.heappush(timers, (due, index))
            if answer.admits_below is None:
                self.unbounded.add(index)
                self.bounds[index] = -math.inf
            else:
                self.unbounded.discard(index)
                self.bounds[index] = answer.admits_below
            self._file(index, answer.opening)
        return self._open

    def _file(self, index: int, opening: Opening | None) -> None:
        """Keep `_open` in configuration order as backend `index`'s answer changes (a change at one backend
        costs a search, not a rebuild of the list)."""
        order = self._open_order
        at = bisect_left(order, index)
        present = at < len(order) and order[at] == index
        if opening is None:
            if present:
                del order[at], self._open[at]
                self.open_indexes.discard(index)
        elif present:
            self._open[at] = opening
        else:
            order.insert(at, index)
            self._open.insert(at, opening)
            self.open_indexes.add(index)

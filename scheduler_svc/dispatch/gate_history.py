"""What one model's gates did lately, kept for traced requests' queue waits (only with `[tracing]` on).

Each decision pass asks the best backlogged band's gates whether a request may go (`openings.BackendGates`,
the band-level answer the `llmsched_gate_closed` gauges show). The history keeps each change of that
answer per backend and class, the latest `KEPT_CHANGES` of them, and who is closed now. A traced request
marks the history when it starts waiting and reads, when it is sent, the changes since for its own class
and the better classes it waits behind (`GateLog`, one view per class): which gates held it, why, and when
they opened. Nothing is copied per request while it waits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from scheduler_svc.config import PriorityClassConfig
from scheduler_svc.core.tracing import GateChange, GateLog
from scheduler_svc.policies import GateCause

KEPT_CHANGES = 256  # the model's latest gate changes, all classes together


class GateHistory:
    """A model's recent gate changes, and a `GateLog` per priority class (`log`)."""

    def __init__(self, classes: Sequence[PriorityClassConfig], kept: int = KEPT_CHANGES) -> None:
        self._changes: deque[GateChange] = deque(maxlen=kept)
        self._count = 0  # changes ever recorded: a mark is this count at the moment it was taken
        self._current: dict[tuple[str, str], GateChange] = {}  # (class, backend) -> the change it is at
        self._logs: dict[str, ClassGateLog] = {}
        self.use_classes(classes)

    def use_classes(self, classes: Sequence[PriorityClassConfig]) -> None:
        """The classes a reload left (ranks may have moved): each class's log reads its own and the better
        classes' changes from now on (a request already waiting keeps the log it took)."""
        self._logs = {
            c.name: ClassGateLog(self, frozenset(b.name for b in classes if b.rank <= c.rank)) for c in classes
        }

    def log(self, priority_class: str) -> GateLog:
        """What holds a request of `priority_class`: its class's gates and the better classes'."""
        return self._logs[priority_class]

    def saw(self, priority_class: str, backend: str, cause: GateCause, now: float) -> None:
        """The band-level decision of `backend`'s gate for `priority_class` now (kept only when it changed; a
        gate first seen open is no change)."""
        key = (priority_class, backend)
        last = self._current.get(key)
        if (last.cause if last is not None else GateCause.OPEN.value) == cause.value:
            return
        change = GateChange(now, backend, priority_class, cause.value)
        self._current[key] = change
        self._changes.append(change)
        self._count += 1

    def mark(self) -> int:
        return self._count

    def closed(self, classes: frozenset[str]) -> list[GateChange]:
        return [c for c in self._current.values() if c.priority_class in classes and c.cause != GateCause.OPEN.value]

    def since(self, mark: int, classes: frozenset[str]) -> tuple[list[GateChange], int]:
        newer = self._count - mark
        kept = min(newer, len(self._changes))
        recent = [self._changes[i] for i in range(len(self._changes) - kept, len(self._changes))]
        mine = [c for c in recent if c.priority_class in classes]
        lost = newer - kept  # of every class: how many of them were this one's is not known
        return mine, lost


class ClassGateLog:
    """The history as one class's requests see it (`core.tracing.GateLog`)."""

    def __init__(self, history: GateHistory, classes: frozenset[str]) -> None:
        self._history = history
        self._classes = classes

    def mark(self) -> int:
        return self._history.mark()

    def closed(self) -> list[GateChange]:
        return self._history.closed(self._classes)

    def since(self, mark: int) -> tuple[list[GateChange], int]:
        return self._history.since(mark, self._classes)

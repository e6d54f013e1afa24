"""Which priority classes are around: the input of `max_engine_running_when_contended` and of the TPOT
limit a lower class inherits from a better active one."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_svc.config import PriorityClassConfig


class ClassActivity:
    """When each class was last active (a request admitted, sent or ended) and how many of it run, so a
    class can hold back while a better-ranked one is around (`max_engine_running_when_contended`, and a
    better class's TPOT limit)."""

    def __init__(self, classes: Sequence[PriorityClassConfig]) -> None:
        self._last: dict[str, float] = {}
        self._running: dict[str, int] = {}
        self.use(classes)

    def use(self, classes: Sequence[PriorityClassConfig]) -> None:
        """The classes of a (reloaded) configuration: what each did so far still counts."""
        self._classes = list(classes)
        self._tpot_classes = [c for c in self._classes if c.max_tpot_seconds > 0]

    def running(self, priority_class: str) -> int:
        """How many requests of the class run now."""
        return self._running.get(priority_class, 0)

    def forget(self, priority_class: str) -> None:
        """A class left the configuration and nothing of it runs: drop what was kept of it."""
        self._last.pop(priority_class, None)
        self._running.pop(priority_class, None)

    def touch(self, priority_class: str, now: float) -> None:
        self._last[priority_class] = now

    def started(self, priority_class: str, now: float) -> None:
        self._running[priority_class] = self._running.get(priority_class, 0) + 1
        self._last[priority_class] = now

    def ended(self, priority_class: str, now: float) -> None:
        self._running[priority_class] = max(0, self._running.get(priority_class, 0) - 1)
        self._last[priority_class] = now

    def better_tpot_limit(self, cls: PriorityClassConfig, now: float) -> float:
        """The tightest TPOT limit among better-ranked classes that run a request now or were active within
        this class's contention window (0: none). TPOT is engine-wide: a lower class's request slows every
        running one, so it must not push the engine past a better active class's limit."""
        limit = 0.0
        for other in self._tpot_classes:
            if other.rank >= cls.rank:
                continue
            if self._active(other, now, cls.contention_window_seconds):
                limit = other.max_tpot_seconds if not limit else min(limit, other.max_tpot_seconds)
        return limit

    def _active(self, other: PriorityClassConfig, now: float, window: float) -> bool:
        return bool(self._running.get(other.name, 0)) or now - self._last.get(other.name, float("-inf")) <= window

    def better_active(self, cls: PriorityClassConfig, now: float) -> bool:
        """Whether a better-ranked class runs a request now or was active within the class's window; only
        computed for classes that use it."""
        if not cls.max_engine_running_when_contended:
            return False
        window = cls.contention_window_seconds
        for other in self._classes:
            if other.rank >= cls.rank:
                continue
            if self._running.get(other.name, 0) or now - self._last.get(other.name, float("-inf")) <= window:
                return True
        return False

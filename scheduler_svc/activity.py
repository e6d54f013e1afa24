"""Which priority classes are around: the input of `max_engine_running_when_contended`."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_svc.config import PriorityClassConfig


class ClassActivity:
    """When each class was last active (a request admitted, sent or ended) and how many of it run, so a
    class can hold back while a better-ranked one is around (`max_engine_running_when_contended`)."""

    def __init__(self, classes: Sequence[PriorityClassConfig]) -> None:
        self._classes = list(classes)
        self._last: dict[str, float] = {}
        self._running: dict[str, int] = {}

    def touch(self, priority_class: str, now: float) -> None:
        self._last[priority_class] = now

    def started(self, priority_class: str, now: float) -> None:
        self._running[priority_class] = self._running.get(priority_class, 0) + 1
        self._last[priority_class] = now

    def ended(self, priority_class: str, now: float) -> None:
        self._running[priority_class] = max(0, self._running.get(priority_class, 0) - 1)
        self._last[priority_class] = now

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

"""Time as the queueing core sees it: injected, so policy tests need no sleeps."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A monotonic clock in seconds."""

    def now(self) -> float: ...


class MonotonicClock:
    """The real clock."""

    def now(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock tests move by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

"""How fast a queue drains: dispatches per second over a recent window, on the injected clock."""

from __future__ import annotations

from collections import deque


class RateMeter:
    """Events per second over the last `window` seconds (at most `max_events` remembered)."""

    def __init__(self, window: float = 30.0, max_events: int = 512) -> None:
        self._window = window
        self._times: deque[float] = deque(maxlen=max_events)

    def record(self, now: float) -> None:
        self._times.append(now)

    def rate(self, now: float) -> float:
        """Events per second; 0.0 when fewer than two recent events."""
        while self._times and now - self._times[0] > self._window:
            self._times.popleft()
        if len(self._times) < 2:
            return 0.0
        span = max(now - self._times[0], 1e-3)
        return len(self._times) / span

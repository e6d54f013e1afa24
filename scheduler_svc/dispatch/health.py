"""Whether the scheduler's own loops work, and what they got wrong: the core's view of service health.

An unexpected exception in a loop (a policy bug, an adapter bug) must not stop other models or bands, nor
pass silently. `InternalErrors` counts every one in `llmsched_internal_errors_total{component}` and logs
each distinct error (exception type and the frame that raised it) once with its traceback, later repeats
at debug level, so a loop that fails on every event cannot flood the log. `ServiceHealth` collects
"unhealthy" verdicts per loop; the gRPC face turns them into grpc.health.v1 NOT_SERVING, so a load
balancer stops sending to a replica whose scheduler is wedged, and back to SERVING once it recovers.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)

# Fixed label values of llmsched_internal_errors_total (never a client string).
COMPONENTS = ("admission", "dispatch", "positions", "monitor", "servicer", "http", "watchdog", "cluster")
MAX_DISTINCT_LOGGED = 256  # distinct errors remembered for the once-only log; later new ones log again


def _error_key(exc: BaseException) -> tuple[str, str, int]:
    """The exception's type and the innermost frame that raised it."""
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames else None
    return type(exc).__qualname__, last.filename if last else "?", last.lineno or 0 if last else 0


class InternalErrors:
    """Counts and logs unexpected exceptions of the scheduler's own code."""

    def __init__(self, counter: Callable[[str], None]) -> None:
        self._count = counter
        self._logged: set[tuple[str, str, int]] = set()

    def report(self, component: str, exc: BaseException, **context: object) -> None:
        """Record one unexpected exception raised in `component` (one of COMPONENTS)."""
        assert component in COMPONENTS, component
        self._count(component)
        key = _error_key(exc)
        if key in self._logged:
            log.debug("internal_error_repeated", component=component, error=repr(exc), **context)
            return
        if len(self._logged) >= MAX_DISTINCT_LOGGED:
            self._logged.clear()
        self._logged.add(key)
        log.error("internal_error", component=component, exc_info=exc, **context)


class ServiceHealth:
    """Unhealthy verdicts by check name (e.g. "dispatch:<model>"); serving while there are none."""

    def __init__(self) -> None:
        self._problems: dict[str, str] = {}
        self.changed = asyncio.Event()  # set on every change of `serving`; the watcher clears it

    @property
    def serving(self) -> bool:
        return not self._problems

    @property
    def problems(self) -> dict[str, str]:
        """Check name -> why it is unhealthy."""
        return dict(self._problems)

    def set(self, check: str, problem: str | None) -> None:
        """Mark `check` unhealthy with `problem`, or healthy with None."""
        was_serving = self.serving
        if problem is None:
            if self._problems.pop(check, None) is not None:
                log.warning("health_recovered", check=check)
        elif check not in self._problems:
            self._problems[check] = problem
            log.error("health_failing", check=check, problem=problem)
        if self.serving != was_serving:
            self.changed.set()


class LoopHealth:
    """One dispatch loop's health: passes that failed in a row, and how long it has been stalled."""

    def __init__(self, name: str, health: ServiceHealth, *, max_failed_passes: int, max_stall_seconds: float) -> None:
        self.name = name
        self._health = health
        self._max_failed = max_failed_passes
        self._max_stall = max_stall_seconds
        self.failed_in_a_row = 0
        self._stalled_since: float | None = None
        self._stalled = False

    def pass_done(self, ok: bool) -> None:
        """A dispatch pass ended, with or without an unexpected error."""
        self.failed_in_a_row = 0 if ok else self.failed_in_a_row + 1
        if ok:
            self._health.set(f"{self.name}:errors", None)
        elif self.failed_in_a_row >= self._max_failed:
            self._health.set(f"{self.name}:errors", f"{self.failed_in_a_row} dispatch passes failed in a row")

    def observe(self, now: float, *, could_dispatch: bool, dispatched_since_last: bool) -> None:
        """A watchdog look: `could_dispatch` when work is queued and a gate is open for it."""
        if dispatched_since_last or not could_dispatch:
            self._stalled_since = None
            if self._stalled:
                self._stalled = False
                self._health.set(f"{self.name}:stall", None)
            return
        if self._stalled_since is None:
            self._stalled_since = now
        if self._max_stall and not self._stalled and now - self._stalled_since >= self._max_stall:
            self._stalled = True
            self._health.set(f"{self.name}:stall", f"no dispatch for {now - self._stalled_since:.0f}s with work ready")


class StallWatch:
    """The watchdog's look at one dispatch loop: work that could go now has been waiting while nothing was
    sent since the last look (the loop is wedged), told to the loop's health."""

    def __init__(self, health: LoopHealth) -> None:
        self._health = health
        self._sent = 0  # requests sent so far
        self._sent_at_last_look = 0

    def count(self, sent: int) -> None:
        """`sent` more requests went."""
        self._sent += sent

    @property
    def sent(self) -> int:
        """Requests sent so far."""
        return self._sent

    def look(self, now: float, could_dispatch: bool) -> None:
        moved = self._sent != self._sent_at_last_look
        self._sent_at_last_look = self._sent
        self._health.observe(now, could_dispatch=could_dispatch, dispatched_since_last=moved)

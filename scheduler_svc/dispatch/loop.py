"""The dispatch loop of one model: it sleeps until something happened that may let a request go, then runs
one decision pass.

It wakes on events only (a new request, an engine accepting or starting a request, a request ending, a new
metrics reading, a grant), never on a fixed tick. After each pass it arms one timer for what changes by time
alone, which no event marks: a fairness policy may hold its choice briefly for a user about to return
(`wake_at`), and the choice must be made again when that wait ends; a backend's failover cooldown may end
while requests wait, and its gate may open then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from attrs import define, field

from scheduler_svc.core.clock import Clock
from scheduler_svc.dispatch.health import InternalErrors, LoopHealth


@define(eq=False)
class DispatchLoop:
    """Runs `decide` (one pass) each time it is woken, then arms a timer for `choose_again_at()`."""

    _decide: Callable[[], object]
    _choose_again_at: Callable[[], float | None]
    _clock: Clock
    _errors: InternalErrors
    _health: LoopHealth
    _model: str
    _wake: asyncio.Event = field(init=False, factory=asyncio.Event)
    _timer: asyncio.TimerHandle | None = field(init=False, default=None)

    def wake(self) -> None:
        """Something happened that may let a request go: pass again (once, however many wake it meanwhile)."""
        self._wake.set()

    def take_wake(self) -> bool:
        """Whether the loop was woken since the last pass began, and consume that: what `run` does before each
        pass (a driver that steps the loop by hand, on virtual time, uses it instead of `run`)."""
        woken = self._wake.is_set()
        self._wake.clear()
        return woken

    def choose_again_at(self) -> float | None:
        """When a held choice must be made again (the clock's time), None when no policy holds one."""
        return self._choose_again_at()

    async def run(self) -> None:
        """Pass whenever woken, until cancelled. A pass that raises (a policy bug) is counted and reported to
        the loop's health; the loop goes on with the next event."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                self._decide()
                self._arm()
            except Exception as exc:
                self._errors.report("dispatch", exc, model=self._model)
                self._health.pass_done(ok=False)

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        due = self._choose_again_at()
        if due is not None:
            delay = max(0.0, due - self._clock.now())
            self._timer = asyncio.get_running_loop().call_later(delay, self.wake)

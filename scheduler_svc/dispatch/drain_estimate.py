"""When a model's queued requests can leave the queue: what a refusal's retry hint and a waiting client's
estimated wait are built on (`capacity.dispatch_eta` combines the two estimates).

At the recent dispatch rate; and while no backend can take a request of the class now, not before running
requests end and make room: each running request's remaining tokens at its engine's last time per output
token (else its own pace so far).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from attrs import define, field

from scheduler_svc.config import PriorityClassConfig
from scheduler_svc.core.clock import Clock
from scheduler_svc.core.ticket import Ticket
from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.dispatch.capacity import dispatch_eta
from scheduler_svc.dispatch.openings import BackendGates
from scheduler_svc.dispatch.run_ledger import RunLedger

FREES_REFRESH_SECONDS = 0.25  # how long an estimate of when running requests end is reused


def _time_left(ticket: Ticket, handle: BackendHandle, now: float) -> float | None:
    """Expected seconds until a running request ends: the tokens it may still generate at its engine's last
    time per output token (else its own pace so far); None when neither is known."""
    reading = handle.estimator.reading
    tpot = reading.tpot_seconds if reading is not None and reading.ok else None
    if not tpot and ticket.first_token_at is not None and ticket.completion_tokens > 1:
        tpot = (now - ticket.first_token_at) / (ticket.completion_tokens - 1)
    if not tpot:
        return None
    return max(0, ticket.request.max_tokens - ticket.completion_tokens) * tpot


@define(eq=False)
class DrainEstimate:
    """One model's estimate of when so many more requests of a class can have been dispatched."""

    _clock: Clock
    _ledger: RunLedger
    _gates: BackendGates
    _classes: Mapping[str, PriorityClassConfig]
    _rate: Callable[[float], float]  # recent first dispatches per second at a time (0: unknown)
    # class -> (when, `_frees`)
    _frees_cache: dict[str, tuple[float, list[float] | None]] = field(init=False, factory=dict)

    def eta(self, needed: int, priority_class: str) -> float | None:
        """Seconds until `needed` more requests of the class's band can have left the queue: at the recent
        dispatch rate, and while no backend can take one now, as running requests end and make room (see
        `capacity.dispatch_eta`). None when neither is known."""
        now = self._clock.now()
        return dispatch_eta(needed, self._rate(now), self._frees(priority_class, now))

    def _frees(self, priority_class: str, now: float) -> list[float] | None:
        """When no backend can take a request of the class now: each running request's expected seconds
        left, ascending; None while one can. Worked out at most once per FREES_REFRESH_SECONDS per class
        (queue notices ask for every waiter)."""
        cached = self._frees_cache.get(priority_class)
        if cached is not None and 0 <= now - cached[0] < FREES_REFRESH_SECONDS:
            return cached[1]
        cls = self._classes[priority_class]
        frees: list[float] | None = None
        if not self._gates.open(cls, cls, "", now):  # "": a user with nothing running (no gauge updates)
            left = (_time_left(t, self._ledger.backend_of(t), now) for t in self._ledger.tickets())
            frees = sorted(t for t in left if t is not None)
        self._frees_cache[priority_class] = (now, frees)
        return frees

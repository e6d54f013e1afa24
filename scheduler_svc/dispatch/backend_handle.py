"""A backend as the dispatch core holds it: the adapter, its gate, its load estimator, its cooldown, and
whether it is draining.

It lives apart from the dispatcher so that a ticket can name the backend it was assigned without
importing the dispatcher (the ticket calls back through its own `TicketHost` Protocol).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from backends.base import Backend, BackendLoad
from scheduler_svc.config import BackendConfig
from scheduler_svc.dispatch.load import LoadEstimator
from scheduler_svc.policies.gate import Gate

log = structlog.get_logger(__name__)


class Drain(enum.StrEnum):
    """Why a backend takes no new request (a fixed set: a metric label). Its running requests finish."""

    ADMIN = "admin"  # an admin drained it (DrainBackend, `llmsched backend drain`) until it is undrained
    CONFIG = "config"  # its configuration says `drained = true`
    REMOVED = "removed"  # it left the configuration: it goes once its running requests have ended


@dataclass(eq=False)
class BackendHandle:
    """A backend as a dispatcher sees it: the adapter, its gate, and what was sent to it."""

    config: BackendConfig
    backend: Backend
    gate: Gate
    estimator: LoadEstimator

    def __post_init__(self) -> None:
        # Read on every gate question and dispatch, so kept as plain attributes: a reload gives the handle
        # its backend's new config under the same name, and whether requests to it carry a numeric engine
        # priority is fixed by its config and kind when it is built.
        self.name: str = self.config.name
        self.sends_priority: bool = self.config.priority_scheduling and self.backend.capabilities.supports_priority
        self._cool_until = 0.0  # no request goes to it before this time: it failed one before its first token
        self.drains: set[Drain] = {Drain.CONFIG} if self.config.drained else set()  # none: it takes new work
        self._cooling_changed: list[Callable[[], None]] = []

    @property
    def cool_until(self) -> float:
        return self._cool_until

    @cool_until.setter
    def cool_until(self, when: float) -> None:
        self._cool_until = when
        for changed in self._cooling_changed:
            changed()

    def watch_cooling(self, changed: Callable[[], None]) -> None:
        """Tell `changed()` whenever `cool_until` is set (the gates' reusable decisions rest on it)."""
        self._cooling_changed.append(changed)

    @property
    def draining(self) -> bool:
        """Whether it takes no new request (for any reason in `drains`)."""
        return bool(self.drains)

    def cooling_for(self, now: float) -> float:
        """Seconds until it may take requests again after a failover (0: it may now)."""
        return max(0.0, self._cool_until - now)

    def record_reading(self, reading: BackendLoad) -> None:
        """A scrape of the backend: the estimator sets it against what was sent (and may learn the engine's
        slots from it), the gate learns from it."""
        slots = self.estimator.engine_slots
        self.estimator.record_reading(reading)
        if self.estimator.engine_slots != slots:
            log.info("engine_slots_learned", backend=self.name, slots=self.estimator.engine_slots, before=slots)
        self.gate.observe(reading)

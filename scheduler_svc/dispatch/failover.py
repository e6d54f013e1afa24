"""Failover: whether a request an engine failed before its first token may be queued again.

An engine that refuses a connection or says it is overloaded said nothing against the request itself,
so the request goes back to the head of its user's queue and the engine cools down for a while, so the
next dispatch goes elsewhere. The dispatcher does the requeueing; this module only decides.
"""

from __future__ import annotations

from backends.errors import BackendError, BackendOverloaded, BackendUnavailable
from scheduler_svc.config import ModelConfig
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.dispatch.backend_handle import BackendHandle

# Errors that say nothing against the request itself, only that this engine could not take it now.
FAILOVER_ERRORS = (BackendUnavailable, BackendOverloaded)


class FailoverRule:
    """A model's failover settings (`failover_attempts`, `failover_cooldown_seconds`) as one decision."""

    def __init__(self, model: ModelConfig) -> None:
        self.use(model)

    def use(self, model: ModelConfig) -> None:
        """The settings of a (reloaded) configuration, for the failures from now on."""
        self._attempts = model.failover_attempts
        self._cooldown = model.failover_cooldown_seconds

    def may_retry(self, request: QueuedRequest, error: BackendError, attempts: int, now: float) -> bool:
        """Whether a request that has been dispatched `attempts` times and failed with `error` before its
        first token may be queued again: the error is about the engine's availability, the request has
        attempts left and its deadline has not passed."""
        return (
            self.blames_engine(error)
            and attempts <= self._attempts
            and (request.deadline is None or now < request.deadline)
        )

    @staticmethod
    def blames_engine(error: BackendError) -> bool:
        """Whether `error` says the engine could not take a request now (unreachable, overloaded), not that
        the request was wrong: the engine then cools down whether or not the request may go again."""
        return isinstance(error, FAILOVER_ERRORS)

    def cool_down(self, handle: BackendHandle, now: float) -> None:
        """The backend failed a request: it takes none for the cooldown."""
        handle.cool_until = now + self._cooldown

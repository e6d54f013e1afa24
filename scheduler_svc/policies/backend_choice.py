"""Backend choice: which of the backends whose gates are open takes the request.

The policy sees the candidate request and every open backend with the gate inputs its gate decided on
(read-only); the dispatcher has already left out closed gates and backends cooling down after a failover.
A choice that needs more than load (a prefix cache's locality, say) is a new policy here, nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from scheduler_svc.policies.gate import GateInputs
from scheduler_svc.policies.registry import Registry
from scheduler_svc.request import QueuedRequest


class OpenBackend(Protocol):
    """A backend whose gate admits the candidate now, as a policy sees it (read-only)."""

    @property
    def name(self) -> str: ...

    @property
    def inputs(self) -> GateInputs:
        """What its gate decided on, for this candidate."""
        ...


B = TypeVar("B", bound=OpenBackend)


class BackendPolicy(Protocol):
    """Picks the backend a request goes to among the open ones (never empty)."""

    def choose(self, request: QueuedRequest, backends: Sequence[B]) -> B:
        """`request`: the request about to go; `backends`: those whose gates admit it, in config order."""
        ...


class LeastLoaded:
    """The backend with the fewest requests the candidate would queue behind, then the shortest estimated
    engine queue, then the fewest in flight; ties go to the first configured."""

    def choose(self, request: QueuedRequest, backends: Sequence[B]) -> B:
        return min(backends, key=lambda b: (b.inputs.waiting_ahead(), b.inputs.estimated_waiting(), b.inputs.in_flight))


DEFAULT_BACKEND_POLICY = "least_loaded"
BACKEND_POLICIES: Registry[BackendPolicy] = Registry("backend")
BACKEND_POLICIES.register(
    DEFAULT_BACKEND_POLICY,
    LeastLoaded,
    "fewest requests ahead of the candidate at the engine, then shortest estimated queue, then fewest in flight",
)

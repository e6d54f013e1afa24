"""Backend choice: which of the backends whose gates are open takes the request.

The policy sees the candidate requests, each with every backend open to it and the gate inputs its gate
decided on (read-only); the dispatcher has already left out closed gates and backends cooling down after a
failover. The first candidate is the fairness policy's own choice; more come only when the model sets
`locality.deficit_bound` (D-LPM, `locality.py`): then the policy picks the (request, backend) pair. A
choice that needs more than load (a prefix cache's locality, `prefix_locality`) is a policy here, nothing
else; `on_dispatched` tells it where each request went, so it can learn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from scheduler_svc.policies.gate import GateInputs
from scheduler_svc.policies.interfaces import PromptView
from scheduler_svc.policies.registry import Registry


class OpenBackend(Protocol):
    """A backend whose gate admits the candidate now, as a policy sees it (read-only)."""

    @property
    def name(self) -> str: ...

    @property
    def inputs(self) -> GateInputs:
        """What its gate decided on, for this candidate."""
        ...

    @property
    def load(self) -> tuple[int, int, int]:
        """`load_of(inputs)`, worked out once with the gate's answer (policies sort backends by it)."""
        ...


B = TypeVar("B", bound=OpenBackend)


class InFlightCounts:
    """Requests in flight at each backend of a model, by name, with their total kept as counts change, so a
    policy's average load costs nothing per decision however many backends the model has. Read-only for
    policies; whoever tracks requests (the run ledger) sets the counts."""

    def __init__(self, counts: Mapping[str, int] | None = None) -> None:
        self._counts = dict(counts or {})
        self._total = sum(self._counts.values())

    def __len__(self) -> int:
        return len(self._counts)

    def get(self, backend: str, default: int) -> int:
        """The backend's count, `default` for a backend not counted here."""
        return self._counts.get(backend, default)

    def counts(self) -> dict[str, int]:
        """Every backend's count (a copy)."""
        return dict(self._counts)

    def average(self) -> float:
        """Requests in flight per backend (0 with no backend)."""
        return self._total / len(self._counts) if self._counts else 0.0

    def set(self, backend: str, count: int) -> None:
        self._total += count - self._counts.get(backend, 0)
        self._counts[backend] = count

    def drop(self, backend: str) -> None:
        self._total -= self._counts.pop(backend, 0)


@dataclass(slots=True)
class Candidate(Generic[B]):
    """A request that may go now, with the backends whose gates admit it (never empty, config order)."""

    request: PromptView
    backends: Sequence[B]


class BackendPolicy(Protocol):
    """Picks the backend a request goes to among the open ones, or the (request, backend) pair among
    several candidate requests; hears where each request went."""

    def choose(self, request: PromptView, backends: Sequence[B]) -> B:
        """`request`: the request about to go; `backends`: those whose gates admit it, in config order."""
        ...

    def choose_among(self, candidates: Sequence[Candidate[B]], in_flight: InFlightCounts) -> tuple[PromptView, B]:
        """The request to send and its backend. `candidates` (never empty): the fairness policy's choice
        first, then other users' next requests that fairness allows now, in its order; `in_flight`: every
        backend of the model (open or not) -> requests in flight there."""
        ...

    def on_dispatched(self, request: PromptView, backend: str) -> None:
        """`request` was sent to the backend named `backend`."""
        ...


def load_of(inputs: GateInputs) -> tuple[int, int, int]:
    """Fewest requests the candidate would queue behind, then shortest estimated engine queue, then fewest
    in flight: least loaded first."""
    return (inputs.waiting_ahead(), inputs.estimated_waiting(), inputs.in_flight)


def load_order(backend: OpenBackend) -> tuple[int, int, int]:
    """The backend's place in least-loaded order (`load_of` its gate's inputs)."""
    return backend.load


class LeastLoaded:
    """The backend with the fewest requests the candidate would queue behind, then the shortest estimated
    engine queue, then the fewest in flight; ties go to the first configured. Among several candidates it
    always sends the fairness policy's choice (the first)."""

    def __init__(self, settings: object = None) -> None:
        """`settings` (the model's locality section) is not used: load is all this policy weighs."""

    def choose(self, request: PromptView, backends: Sequence[B]) -> B:
        return min(backends, key=load_order)

    def choose_among(self, candidates: Sequence[Candidate[B]], in_flight: InFlightCounts) -> tuple[PromptView, B]:
        first = candidates[0]
        return first.request, self.choose(first.request, first.backends)

    def on_dispatched(self, request: PromptView, backend: str) -> None:
        return None


DEFAULT_BACKEND_POLICY = "least_loaded"
BACKEND_POLICIES: Registry[BackendPolicy] = Registry("backend")
BACKEND_POLICIES.register(
    DEFAULT_BACKEND_POLICY,
    LeastLoaded,
    "fewest requests ahead of the candidate at the engine, then shortest estimated queue, then fewest in flight",
)

"""The run ledger: what one model has in flight, per backend and per priority class.

Each dispatched ticket is entered with the backend it was sent to (the ticket itself only names it), and
leaves when it ends or fails over. The ledger keeps what depends on that and nothing else: which classes
run (the contention rules of `activity` read it), each backend's estimator told of the end, and each
backend's in-flight gauge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduler_svc.core.ticket import Ticket
from scheduler_svc.dispatch.activity import ClassActivity
from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.dispatch.metrics import BackendSeries
from scheduler_svc.policies import InFlightCounts


class RunLedger:
    """The tickets of one model that are at a backend now."""

    def __init__(
        self, backends: Sequence[BackendHandle], activity: ClassActivity, series: Mapping[str, BackendSeries]
    ) -> None:
        self._handles = {h.name: h for h in backends}
        self._activity = activity
        self._series = series
        self._running: dict[str, Ticket] = {}  # request id -> ticket, for every dispatched request
        self._in_flight = InFlightCounts({name: h.estimator.in_flight for name, h in self._handles.items()})

    def __len__(self) -> int:
        return len(self._running)

    def ticket(self, request_id: str) -> Ticket | None:
        """The running request's ticket, None when it does not run here."""
        return self._running.get(request_id)

    def tickets(self) -> list[Ticket]:
        return list(self._running.values())

    def add_backend(self, handle: BackendHandle) -> None:
        """A backend joined the model (a reload added it)."""
        self._handles[handle.name] = handle
        self._in_flight.set(handle.name, handle.estimator.in_flight)

    def remove_backend(self, name: str) -> None:
        """A removed backend leaves the model: nothing of the model runs there any more."""
        handle = self._handles[name]
        assert handle.estimator.in_flight == 0, f"backend {name} still has requests in flight"
        del self._handles[name]
        self._in_flight.drop(name)

    def backend(self, name: str) -> BackendHandle | None:
        """The model's backend called `name`, None when there is none."""
        return self._handles.get(name)

    def backend_of(self, ticket: Ticket) -> BackendHandle:
        """The backend a dispatched ticket was sent to."""
        assert ticket.backend is not None, "the ticket was not dispatched"
        return self._handles[ticket.backend.name]

    def in_flight(self) -> InFlightCounts:
        """Requests in flight at each backend, by name (what the backend policy balances): kept as requests
        start and end, read-only."""
        return self._in_flight

    def start(self, ticket: Ticket, handle: BackendHandle, now: float) -> None:
        """The ticket was sent to `handle` (its estimator already counts it)."""
        self._running[ticket.request.request_id] = ticket
        self._activity.started(ticket.request.priority_class, now)
        self._in_flight.set(handle.name, handle.estimator.in_flight)
        self._series[handle.name].in_flight.value = handle.estimator.in_flight

    def end(self, ticket: Ticket, now: float) -> BackendHandle:
        """The dispatched ticket no longer holds its backend (it ended, or comes back to the queue); returns
        that backend."""
        handle = self.backend_of(ticket)
        handle.estimator.finished(ticket.request.request_id, now)
        if self._running.pop(ticket.request.request_id, None) is not None:
            self._activity.ended(ticket.request.priority_class, now)
        self._in_flight.set(handle.name, handle.estimator.in_flight)
        self._series[handle.name].in_flight.value = handle.estimator.in_flight
        return handle

"""The handover of a queued request to a backend, with everything that changes with it.

Whoever decides that a request goes (a decision pass, a cluster leader's grant, a leader adopting a request
that already runs) hands it over here: out of the queue book, charged to its band's fairness policy (and to
its tenant's nested one, among its end users),
counted in the backend's load estimate (with the engine priority it carries), assigned on its ticket,
remembered by the backend policy (locality), entered in the run ledger, and counted in the drain rate and
the dispatch metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from scheduler_svc.core.errors import InternalError
from scheduler_svc.core.ticket import Outcome, Ticket
from scheduler_svc.core.tracing import GateLog
from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.dispatch.metrics import RequestCounters
from scheduler_svc.dispatch.queue_book import QueueBook
from scheduler_svc.dispatch.rate import RateMeter
from scheduler_svc.dispatch.run_ledger import RunLedger
from scheduler_svc.policies import BackendPolicy, Fairness


class Handover:
    """Moves one model's queued tickets to backends; keeps the drain rate (first dispatches per second)."""

    def __init__(
        self,
        book: QueueBook,
        ledger: RunLedger,
        fairness: Mapping[str, Fairness],
        backend_policy: BackendPolicy,
        counters: RequestCounters,
        *,
        gate_logs: Mapping[str, GateLog] | None = None,
    ) -> None:
        """`gate_logs`: per class, what held its requests (with tracing on), for a traced queue wait's end."""
        self._book = book
        self._ledger = ledger
        self._fairness = fairness
        self._backend_policy = backend_policy
        self._counters = counters
        self._gate_logs = gate_logs
        self._drain = RateMeter()
        self._listeners: list[Callable[[Ticket], None]] = []

    def observe(self, listener: Callable[[Ticket], None]) -> None:
        """Tell `listener` of every ticket handed over, once it is assigned and entered in the ledger (a
        driver that runs requests itself, on a virtual clock, instead of the ticket's own run)."""
        self._listeners.append(listener)

    def drain_rate(self, now: float) -> float:
        """Requests leaving the queue for the first time, per second lately (0: unknown)."""
        return self._drain.rate(now)

    def send(self, ticket: Ticket, handle: BackendHandle, now: float, priority_of: Callable[[], int | None]) -> None:
        """Take a queued ticket out of its queue and assign it to `handle`, with all the accounting;
        `priority_of` gives the engine priority it carries there (asked after fairness charged it)."""
        request = ticket.request
        self._book.take(ticket, dispatched=True)
        try:
            self._fairness[request.priority_class].account.on_dispatched(request)
            self._book.end_users.dispatched(request)
            priority = priority_of()
        except Exception:
            # Out of the queue and not sent: end it now, or its client would wait for nothing.
            ticket.end_in_queue(Outcome.FAILED, InternalError("the scheduler failed to dispatch the request"))
            raise
        handle.estimator.dispatched(request.request_id, priority, request.user)
        ticket.assign(handle, now, priority)
        self._backend_policy.on_dispatched(request, handle.name)
        self._ledger.start(ticket, handle, now)
        first = ticket.attempts == 1  # a failed-over request left the queue, and was observed, the first time
        if first:
            self._drain.record(now)
        self._counters.dispatched(request, handle.name, now - request.admitted_at if first else None)
        if ticket.trace is not None:
            logs = self._gate_logs
            gates = None if logs is None else logs[request.priority_class]
            ticket.trace.dispatched(now, handle.name, ticket.attempts, priority, gates)
        for listener in self._listeners:
            listener(ticket)

"""The port a cluster steers one model's dispatch through (`scheduler_svc.cluster` is its one user).

A replica of a cluster hands the decisions to one leader: it sets who decides and scrapes (`steer`, with a
`steering.DispatchAuthority`), listens to its requests' events (`observe`), sends a queued request where
the leader says (`grant`), counts a request another leader had sent as running here (`adopt`), ends a
queued request the leader refused or ended (`end_queued`), and lists what it holds to register it with a
new leader. Without a cluster nothing here is called and the model decides alone (`steering.LOCAL`).
"""

from __future__ import annotations

from collections.abc import Callable

from attrs import define, field

from backends.errors import BackendUnavailable
from scheduler_svc.core.clock import Clock
from scheduler_svc.core.ticket import Outcome, Ticket
from scheduler_svc.dispatch.decisions import Send
from scheduler_svc.dispatch.openings import BackendGates
from scheduler_svc.dispatch.queue_book import QueueBook
from scheduler_svc.dispatch.request_events import RequestEvents
from scheduler_svc.dispatch.run_ledger import RunLedger
from scheduler_svc.dispatch.steering import DispatchAuthority, DispatchObserver
from scheduler_svc.policies import Fairness


@define(eq=False)
class ClusterPort:
    """What a cluster agent may do to one model's dispatch."""

    _clock: Clock
    _book: QueueBook
    _ledger: RunLedger
    _gates: BackendGates
    _events: RequestEvents
    _fairness_of: Callable[[str], Fairness]
    _send: Send = field(kw_only=True)
    _sent: Callable[[int], None] = field(kw_only=True)
    _stopping: Callable[[], bool] = field(kw_only=True)
    _wake: Callable[[], None] = field(kw_only=True)

    @property
    def authority(self) -> DispatchAuthority:
        """Who decides when requests go (`steering.DispatchAuthority`; `steering.LOCAL` by default)."""
        return self._gates.authority

    def steer(self, authority: DispatchAuthority) -> None:
        """From now on `authority` decides whether the loop dispatches, whether metrics are read here, and the
        in-flight cap per backend; the loop looks again at once."""
        self._gates.steer(authority)
        self._wake()

    def observe(self, observer: DispatchObserver | None) -> None:
        """Tell `observer` (None: nobody) of each local request's events from now on."""
        self._events.observe(observer)

    def grant(self, request_id: str, backend_name: str, engine_priority: int | None) -> bool:
        """Send a queued request to `backend_name` because the cluster's leader decided so, as a decision pass
        would have; False when the request is not queued here (gone, or the service is stopping).

        A backend this replica does not know (the leader's file names one that this replica's does not, until
        both have reloaded the same file) ends the request with BACKEND_UNAVAILABLE, which its client may
        retry, rather than leave it queued for a grant that will not come again."""
        ticket = self._book.ticket(request_id)
        handle = self._ledger.backend(backend_name)
        if ticket is None or self._stopping():
            return False
        if handle is None:
            self._book.take(ticket)
            reason = f"the cluster's leader sent the request to backend {backend_name}, unknown to this replica"
            ticket.end_in_queue(Outcome.FAILED, BackendUnavailable(reason, backend=backend_name))
            return True
        self._send(ticket, handle, self._clock.now(), lambda: engine_priority)
        self._sent(1)
        return True

    def adopt(
        self,
        ticket: Ticket,
        backend_name: str,
        engine_priority: int | None,
        attempt: int,
        *,
        accepted: bool,
        first_token: bool,
        tokens: int,
    ) -> bool:
        """Count a queued ticket as already running at `backend_name` (a replica re-registered a request it
        runs with this new leader): taken out of its queue, assigned without being sent, its progress so far
        counted in the backend's load estimate and in fairness. False when the backend is unknown."""
        handle = self._ledger.backend(backend_name)
        if handle is None or self._book.ticket(ticket.request.request_id) is None:
            return False
        now = self._clock.now()
        self._send(ticket, handle, now, lambda: engine_priority)
        ticket.attempts = max(ticket.attempts, attempt)
        if accepted:
            handle.estimator.accepted(ticket.request.request_id, now)
        if first_token:
            ticket.first_token_at = now
            handle.estimator.started(ticket.request.request_id, now)
        if tokens:
            ticket.completion_tokens = tokens
            self._fairness_of(ticket.request.priority_class).account.on_generated(ticket.request, tokens)
        return True

    def end_queued(self, request_id: str, outcome: Outcome, reason: Exception) -> bool:
        """End a still-queued request with `reason` (the leader refused or ended it); False when it is not
        queued here."""
        ticket = self._book.ticket(request_id)
        if ticket is None:
            return False
        self._book.take(ticket)
        ticket.end_in_queue(outcome, reason)
        return True

    def live_tickets(self) -> list[Ticket]:
        """Every queued or running ticket (what a replica registers with a new leader)."""
        return [*self._book.tickets(), *self._ledger.tickets()]

    def queued_ticket(self, request_id: str) -> Ticket | None:
        return self._book.ticket(request_id)

    def running_ticket(self, request_id: str) -> Ticket | None:
        return self._ledger.ticket(request_id)

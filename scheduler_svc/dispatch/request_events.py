"""What a request's life changes in its model's dispatch: the one interface tickets and runs call back on.

A ticket (`core.ticket.TicketHost`) asks the time and its position, and says when it expires, closes and
settles; a run (`core.request_run.RunHost`) says when the engine took the request, its first token, each
batch of tokens, and a failure before the first token. Each event is kept where it belongs: the run
ledger and the backend's load estimate, the band's fairness policy, the cost and request counters, the
model's caps, the cluster's observer; and the events that may free capacity wake the loop. A failure
before the first token goes back to the head of its user's queue when the failover rule allows it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import structlog
from attrs import define, field

from backends.errors import BackendError
from scheduler_svc.core.clock import Clock
from scheduler_svc.core.errors import QueueTimeout
from scheduler_svc.core.ticket import Outcome, Ticket, TicketState
from scheduler_svc.core.tracing import GateLog
from scheduler_svc.dispatch.capacity import Capacity
from scheduler_svc.dispatch.failover import FailoverRule
from scheduler_svc.dispatch.metrics import RequestCounters
from scheduler_svc.dispatch.queue_book import QueueBook
from scheduler_svc.dispatch.run_ledger import RunLedger
from scheduler_svc.dispatch.steering import DispatchAuthority, DispatchObserver
from scheduler_svc.policies import Fairness
from scheduler_svc.policies.cost import Prices

log = structlog.get_logger(__name__)


@define(eq=False, slots=False)  # not slotted: tests wrap a handler on an instance
class RequestEvents:
    """One model's handler of its tickets' and runs' events."""

    _clock: Clock
    _book: QueueBook
    _ledger: RunLedger
    _fairness: Mapping[str, Fairness]
    _prices: Prices
    _counters: RequestCounters
    _capacity: Capacity
    _failover: FailoverRule
    _authority: Callable[[], DispatchAuthority] = field(kw_only=True)
    _stopping: Callable[[], bool] = field(kw_only=True)
    _wake: Callable[[], None] = field(kw_only=True)
    _settled: Callable[[Ticket], None] = field(kw_only=True)
    _model: str = field(kw_only=True)
    # per class, what holds its requests (with tracing on), for a traced request that waits again after a failover
    _gate_logs: Mapping[str, GateLog] | None = field(kw_only=True, default=None)
    _observer: DispatchObserver | None = field(init=False, default=None)

    def use_prices(self, prices: Prices) -> None:
        """The model's prices from a reloaded configuration, for the cost counted from now on."""
        self._prices = prices

    @property
    def observer(self) -> DispatchObserver | None:
        """Who hears of each request's events besides this model (a cluster follower), if anyone."""
        return self._observer

    def observe(self, observer: DispatchObserver | None) -> None:
        """From now on tell `observer` (None: nobody) of each request's events."""
        self._observer = observer

    # -- what a ticket asks and says (`core.ticket.TicketHost`) ----------------------------------------------
    def now(self) -> float:
        return self._clock.now()

    def position(self, ticket: Ticket) -> int:
        """1-based rank of the ticket's request in its user's queue by the ordering policy; 0 once it left. A
        cluster follower answers with the deciding replica's last word when it has one."""
        local = self._book.position(ticket)
        if local == 0:
            return 0
        told = self._authority().position(ticket.request.request_id)
        return told if told is not None else local

    def expire(self, ticket: Ticket) -> None:
        """End a queued request whose deadline passed; it is never dispatched."""
        self._book.take(ticket)
        ticket.end_in_queue(Outcome.EXPIRED, QueueTimeout(f"request {ticket.request.request_id} expired in the queue"))

    def release(self, ticket: Ticket, outcome: Outcome) -> None:
        """The ticket is closing with `outcome`: take it out of its queue, or free its backend and settle its
        fair share. Fairness charges what the engine did: a request that ended before any engine answered it
        (cancelled while chosen or being sent) is refunded."""
        if ticket.state is TicketState.QUEUED:
            self._book.take(ticket)
        elif ticket.state is TicketState.DISPATCHED:
            self._ledger.end(ticket, self._clock.now())
            reached = outcome is Outcome.COMPLETED or ticket.reached_engine
            account = self._fairness[ticket.request.priority_class].account
            account.on_finished(ticket.request, ticket.completion_tokens, reached_engine=reached)
            self._book.end_users.finished(ticket.request, ticket.completion_tokens, reached_engine=reached)
            self._wake()

    def settled(self, ticket: Ticket) -> None:
        """The ticket recorded its one outcome: its bytes are free, and it is counted and logged."""
        self._capacity.release(ticket.request)
        self._settled(ticket)
        if self._observer is not None:
            self._observer.on_outcome(ticket)
        self._counters.outcome(ticket.request, ticket.outcome.value if ticket.outcome else "?")
        if ticket.trace is not None:
            ended = ticket.finished_at if ticket.finished_at is not None else self._clock.now()
            ticket.trace.ended(ended, ticket.outcome.value if ticket.outcome else "?", ticket.completion_tokens)
        log.debug(
            "request_done",
            model=self._model,
            request_id=ticket.request.request_id,
            user=ticket.request.user,
            outcome=ticket.outcome.value if ticket.outcome else None,
            backend=ticket.backend.name if ticket.backend else None,
            tokens=ticket.completion_tokens,
        )

    # -- what a run says (`core.request_run.RunHost`) ---------------------------------------------------------
    def on_accepted(self, ticket: Ticket) -> None:
        """The engine took the request (its response started)."""
        now = ticket.accepted_at = self._clock.now()
        handle = self._ledger.backend_of(ticket)
        handle.estimator.accepted(ticket.request.request_id, now)
        if (accept := ticket.engine_accept) is not None:
            self._counters.accepted(ticket.request, handle.name, accept)
        if self._observer is not None:
            self._observer.on_accepted(ticket)
        if ticket.trace is not None:
            ticket.trace.accepted(now)

    def on_first_token(self, ticket: Ticket) -> None:
        """The engine sent the request's first token: its prompt is paid for, and a slot may have freed."""
        assert ticket.first_token_at is not None
        request = ticket.request
        self._counters.cost(request, self._prices.cost(request.prompt_tokens_estimate, 0))
        self._ledger.backend_of(ticket).estimator.started(request.request_id, ticket.first_token_at)
        self._counters.first_token(request, ticket.first_token_at - request.admitted_at)
        if self._observer is not None:
            self._observer.on_first_token(ticket)
        if ticket.trace is not None:
            ticket.trace.first_token(ticket.first_token_at, ticket.sent_at)
        self._wake()

    def on_generated(self, ticket: Ticket, tokens: int) -> None:
        """The engine generated `tokens` more tokens of the request."""
        request = ticket.request
        self._fairness[request.priority_class].account.on_generated(request, tokens)
        self._book.end_users.generated(request, tokens)
        self._counters.cost(request, self._prices.cost(0, tokens))
        assert ticket.backend is not None
        self._counters.generated(request, ticket.backend.name, tokens)
        if self._observer is not None:
            self._observer.on_generated(ticket, tokens)

    def on_aborted(self, ticket: Ticket) -> None:
        """The request's open engine request was closed before its end (its caller left, or it was cut). Heard
        after the ticket's close let its backend go (a reload removed it), it is about nothing tracked: a no-op."""
        assert ticket.backend is not None
        name = ticket.backend.name
        if self._ledger.backend(name) is not ticket.backend:
            return
        self._counters.engine_aborted(ticket.request, name, answered=ticket.accepted_at is not None)
        if ticket.trace is not None:
            ticket.trace.aborted(self._clock.now())

    def fail_over(self, ticket: Ticket, error: BackendError) -> bool:
        """The backend failed `ticket` before its first token: queue it again at the head of its user's queue
        and cool the backend down, so the next dispatch goes elsewhere. False when it should fail as it is:
        the error is not about the engine's availability, the request used its attempts or its deadline, or
        the service is stopping. The backend cools down for an engine's failure either way, so the requests
        behind one that may not go again do not meet the same engine at once. A cluster follower always
        queues it again: the leader decides."""
        request = ticket.request
        now = self._clock.now()
        if self._stopping():
            return False
        handle = self._ledger.backend_of(ticket)
        locally = self._authority().dispatches_locally
        if not locally or self._failover.blames_engine(error):
            self._failover.cool_down(handle, now)
        if locally and not self._failover.may_retry(request, error, ticket.attempts, now):
            return False
        self._ledger.end(ticket, now)
        ticket.requeued()  # first: from here a failure below leaves a ticket that close() can end cleanly
        fairness = self._fairness[request.priority_class]
        fairness.account.on_requeued(request)
        self._book.end_users.requeued(request)
        flow, newly_backlogged = self._book.put(ticket, front=True)
        if newly_backlogged:
            fairness.account.on_backlogged(request.user, self._book.band(request.priority_class).flow_views)
        self._book.moved(flow)  # the requests behind it moved down one
        if ticket.trace is not None:
            ticket.trace.failed_over(now)
            ticket.trace.queued(now, None if self._gate_logs is None else self._gate_logs[request.priority_class])
        self._counters.failed_over(request, handle.name)
        log.warning(
            "request_failed_over",
            model=self._model,
            request_id=request.request_id,
            backend=handle.name,
            attempt=ticket.attempts,
            error=str(error),
        )
        if self._observer is not None:
            self._observer.on_failed_over(ticket, error)
        self._wake()
        return True

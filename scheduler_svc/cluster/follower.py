"""The owner's side of the cluster: every request a replica received stays its own local ticket; this tells
the leader about it and carries out the leader's decisions.

- Admission (`confirm`, the scheduler's `AdmissionGuard`): the request is already queued locally (local
  caps); while following, send `Admit` and wait up to admission_wait_seconds for the `Verdict`. A refusal
  raises the leader's error (the face closes the ticket as rejected); no answer in time leaves it queued
  provisionally: registered again when a leader appears, and a later refusal ends it then.
- `Grant` from the leader we are registered with -> `ClusterPort.grant`, the local run sends it to the
  engine. A grant for a request no longer queued here is answered `Report ended(cancelled)` so the leader
  releases what it holds for it; a grant from another leader is ignored (counted).
- The dispatchers' observer: accepted, first token, failover and the end go to the leader at once; token
  counts are summed and sent at most every report_interval_seconds per request.
- Leader change: `register_all` sends every live ticket to the new leader (`force` for those admitted
  before; `running` for those at an engine, which the leader adopts without a grant).

Messages per follower request: Admit + Verdict (2), Grant (1), Reports accepted, first token, tokens every
report_interval, ended (~3 + duration / report_interval). Nothing at all while this replica leads or is
degraded: its requests are then plain local tickets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from backends.errors import BackendError
from scheduler_svc.cluster.messages import (
    Admit,
    ErrorInfo,
    Fail,
    Grant,
    Message,
    Position,
    Report,
    Running,
    Verdict,
    error_info,
    rebuild_error,
)
from scheduler_svc.cluster.metrics import ClusterMetrics
from scheduler_svc.config import ClusterConfig
from scheduler_svc.core.errors import QueueTimeout
from scheduler_svc.core.ticket import Outcome, Ticket, TicketState
from scheduler_svc.dispatch.scheduler import Scheduler
from scheduler_svc.policies.prefix_index import prompt_text

log = structlog.get_logger(__name__)


class Follower:
    """Admission guard, grant handler and dispatch observer of one replica (active while it follows)."""

    def __init__(
        self,
        scheduler: Scheduler,
        name: str,
        cluster: ClusterConfig,
        post: Callable[[str, Message], None],
        metrics: ClusterMetrics,
    ) -> None:
        self._scheduler = scheduler
        self._name = name
        self._cluster = cluster
        self._post = post
        self._metrics = metrics
        self.leader: str | None = None  # the lease holder we are registered with ("name/token")
        self.following = False
        self._registered: set[str] = set()  # request ids the current leader holds a mirror of
        self._provisional: set[str] = set()  # admitted here, not yet confirmed by a leader
        self._verdicts: dict[str, asyncio.Future[ErrorInfo | None]] = {}
        self._tokens: dict[str, int] = {}  # request id -> tokens generated, not yet reported
        self._flush: asyncio.TimerHandle | None = None
        self.positions: dict[str, int] = {}  # request id -> the leader's last Position
        max_chars = max(
            (m.locality.block_chars * m.locality.max_blocks_per_request for m in scheduler.config.models), default=0
        )
        self._max_text = max(0, max_chars)

    @property
    def _leader_name(self) -> str | None:
        return self.leader.split("/", 1)[0] if self.leader else None

    # -- roles ---------------------------------------------------------------------------------------
    def follow(self, holder: str | None) -> None:
        """Follow `holder` (None: no leader yet); a new one gets every live ticket registered."""
        self.following = True
        if holder is not None and holder.split("/", 1)[0] == self._name:
            holder = None  # an earlier term of our own: never register with ourselves
        if holder == self.leader:
            return
        self.leader = holder
        self._registered.clear()
        self._tokens.clear()
        self.positions.clear()
        if holder is not None:
            self.register_all()

    def stop_following(self) -> None:
        """Leading or degraded: requests are local tickets again; pending verdicts are not awaited."""
        self.following = False
        self.leader = None
        self._registered.clear()
        self._tokens.clear()
        self.positions.clear()
        for rid, future in list(self._verdicts.items()):
            if not future.done():
                future.set_result(None)  # admitted locally
            self._provisional.discard(rid)
        self._verdicts.clear()

    def register_all(self) -> None:
        """Send every live local ticket to the current leader."""
        for dispatcher in self._scheduler.dispatchers.values():
            for ticket in dispatcher.cluster.live_tickets():
                self._register(ticket, force=ticket.request.request_id not in self._provisional)

    def _register(self, ticket: Ticket, *, force: bool) -> None:
        to = self._leader_name
        if to is None:
            return
        request = ticket.request
        now = self._scheduler.clock.now()
        running = None
        if ticket.state is TicketState.DISPATCHED and ticket.backend is not None:
            running = Running(
                backend=ticket.backend.name,
                engine_priority=ticket.engine_priority,
                attempt=ticket.attempts,
                accepted=True,  # the engine holds it or soon will: count it in its waiting estimate
                first_token=ticket.first_token_at is not None,
                tokens=ticket.completion_tokens,
            )
        self._registered.add(request.request_id)
        self._post(
            to,
            Admit(
                sender=self._name,
                request_id=request.request_id,
                model=request.model,
                user=request.user,
                priority_class=request.priority_class,
                client_request_id=request.client_request_id,
                text=prompt_text(request.prompt, request.messages)[: self._max_text],
                prompt_chars=request.prompt_chars,
                prompt_bytes=request.prompt_bytes,
                max_tokens=request.max_tokens,
                age=now - request.admitted_at,
                remaining=None if request.deadline is None else request.deadline - now,
                cache_key=request.cache_key,
                force=force,
                running=running,
                watch=ticket.watches_position,
            ),
        )

    # -- admission (AdmissionGuard) --------------------------------------------------------------------
    async def confirm(self, ticket: Ticket) -> None:
        """Have the leader confirm a request just queued here (see the module docstring)."""
        if not self.following:
            return  # leading or degraded: admitted here, by this replica's own caps
        rid = ticket.request.request_id
        future: asyncio.Future[ErrorInfo | None] = asyncio.get_running_loop().create_future()
        self._verdicts[rid] = future
        self._provisional.add(rid)
        self._register(ticket, force=False)
        try:
            async with asyncio.timeout(self._cluster.admission_wait_seconds):
                error = await asyncio.shield(future)
        except TimeoutError:
            log.info("cluster_admission_provisional", request_id=rid, leader=self._leader_name)
            return
        finally:
            self._verdicts.pop(rid, None)
        if error is not None:
            raise rebuild_error(error)

    # -- messages from the leader ------------------------------------------------------------------------
    def on_verdict(self, verdict: Verdict) -> None:
        rid = verdict.request_id
        future = self._verdicts.get(rid)
        if verdict.error is not None:
            self._registered.discard(rid)  # the leader holds nothing for it: its end is not reported
        if future is not None and not future.done():
            future.set_result(verdict.error)
            if verdict.error is None:
                self._provisional.discard(rid)
            return
        if verdict.error is None:
            self._provisional.discard(rid)
            return
        # A late refusal of a provisionally queued request: it ends with the leader's error.
        self._end_queued(rid, Outcome.REJECTED, verdict.error)

    def on_grant(self, grant: Grant) -> None:
        if grant.leader != self.leader or not self.following:
            self._metrics.stale_grants.inc()
            return
        for dispatcher in self._scheduler.dispatchers.values():
            if dispatcher.cluster.grant(grant.request_id, grant.backend, grant.engine_priority):
                self.positions.pop(grant.request_id, None)
                return
        self._metrics.stale_grants.inc()
        if any(d.cluster.running_ticket(grant.request_id) is not None for d in self._scheduler.dispatchers.values()):
            return  # a grant sent again after we took the first one (see Leader.on_admit): nothing to undo
        self._post(grant.sender, Report(self._name, grant.request_id, "ended", outcome=Outcome.CANCELLED.value))

    def on_fail(self, fail: Fail) -> None:
        outcome = Outcome.EXPIRED if fail.error.kind == QueueTimeout.__name__ else Outcome.FAILED
        self._registered.discard(fail.request_id)
        self._end_queued(fail.request_id, outcome, fail.error)

    def on_position(self, position: Position) -> None:
        for dispatcher in self._scheduler.dispatchers.values():
            ticket = dispatcher.cluster.queued_ticket(position.request_id)
            if ticket is not None:
                self.positions[position.request_id] = position.position
                ticket.nudge()
                return

    def _end_queued(self, rid: str, outcome: Outcome, error: ErrorInfo) -> None:
        for dispatcher in self._scheduler.dispatchers.values():
            if dispatcher.cluster.end_queued(rid, outcome, rebuild_error(error)):
                return

    # -- DispatchObserver --------------------------------------------------------------------------------
    def _report(self, ticket: Ticket, kind: str, **fields: object) -> None:
        rid = ticket.request.request_id
        to = self._leader_name
        if not self.following or to is None or rid not in self._registered:
            return
        self._post(to, Report(self._name, rid, kind, **fields))  # type: ignore[arg-type]

    def on_accepted(self, ticket: Ticket) -> None:
        self._report(ticket, "accepted")

    def on_first_token(self, ticket: Ticket) -> None:
        self._report(ticket, "first_token")

    def on_generated(self, ticket: Ticket, tokens: int) -> None:
        rid = ticket.request.request_id
        if not self.following or rid not in self._registered:
            return
        self._tokens[rid] = self._tokens.get(rid, 0) + tokens
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(
                self._cluster.report_interval_seconds, self._flush_tokens
            )

    def _flush_tokens(self) -> None:
        self._flush = None
        to = self._leader_name
        pending, self._tokens = self._tokens, {}
        if to is None or not self.following:
            return
        for rid, tokens in pending.items():
            if rid in self._registered:
                self._post(to, Report(self._name, rid, "tokens", tokens=tokens))

    def on_failed_over(self, ticket: Ticket, error: BackendError) -> None:
        self._send_tokens(ticket)
        self._report(ticket, "error", error=error_info(error))

    def on_outcome(self, ticket: Ticket) -> None:
        rid = ticket.request.request_id
        self._send_tokens(ticket)
        self.positions.pop(rid, None)
        self._provisional.discard(rid)
        self._report(
            ticket,
            "ended",
            outcome=ticket.outcome.value if ticket.outcome else Outcome.CANCELLED.value,
            completion_tokens=ticket.completion_tokens,
        )
        self._registered.discard(rid)

    def _send_tokens(self, ticket: Ticket) -> None:
        """Report a request's pending token count now (before an event that must come after it)."""
        tokens = self._tokens.pop(ticket.request.request_id, 0)
        if tokens:
            self._report(ticket, "tokens", tokens=tokens)

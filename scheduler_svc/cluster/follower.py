"""The owner's side of the cluster: every request a replica received stays its own local ticket; this tells
its model's leader about it and carries out that leader's decisions. Each lease (one per model, see `leases`)
is followed on its own: a replica may follow one model's leader while it leads another model itself.

- Admission (`confirm`, the scheduler's `AdmissionGuard`): the request is already queued locally (local
  caps); while its model's lease is followed, send `Admit` and wait up to admission_wait_seconds for the
  `Verdict`. A refusal raises the leader's error (the face closes the ticket as rejected); no answer in time
  leaves it queued provisionally: registered again when a leader appears, and a later refusal ends it then.
- `Grant` from the leader a request's lease is registered with -> `ClusterPort.grant`, the local run sends it
  to the engine. A grant for a request no longer queued here is answered `Report ended(cancelled)` so the
  leader releases what it holds for it; a grant from another leader is ignored (counted).
- The dispatchers' observer: accepted, first token, failover and the end go to the leader at once; token
  counts are summed and sent at most every report_interval_seconds, one `Tokens` message per leader for all
  of its running requests.
- Leader change of a lease, or following again after being degraded: `register_all` sends every live ticket
  of its models to the leader (`force` for those admitted before; `running` for those at an engine, which the
  leader adopts without a grant), then their `Roster`, so the leader ends its mirrors of requests that ended
  meanwhile (their end was never reported to it).

Messages per follower request: Admit + Verdict (2), Grant (1), Reports accepted, first token, ended (3), and
its share of one Tokens message per report interval. Nothing at all for a model this replica leads, or while
it is degraded: its requests are then plain local tickets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

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
    Tokens,
    Verdict,
    error_info,
    rebuild_error,
    roster,
)
from scheduler_svc.cluster.metrics import ClusterMetrics
from scheduler_svc.config import ClusterConfig
from scheduler_svc.core.errors import QueueTimeout
from scheduler_svc.core.ticket import Outcome, Ticket, TicketState
from scheduler_svc.dispatch.scheduler import Scheduler
from scheduler_svc.policies.prefix_index import prompt_text

log = structlog.get_logger(__name__)


class Follower:
    """Admission guard, grant handler and dispatch observer of one replica, for the leases it follows."""

    def __init__(
        self,
        scheduler: Scheduler,
        name: str,
        cluster: ClusterConfig,
        post: Callable[[str, Message], None],
        metrics: ClusterMetrics,
        plan: Mapping[str, Sequence[str]],
    ) -> None:
        self._scheduler = scheduler
        self._name = name
        self._cluster = cluster
        self._post = post
        self._metrics = metrics
        self._plan = {lease: tuple(models) for lease, models in plan.items()}  # lease -> its models
        self._lease_of = {model: lease for lease, models in plan.items() for model in models}
        self.leaders: dict[str, str | None] = dict.fromkeys(plan)  # lease -> the holder we are registered with
        self.following: set[str] = set()  # the leases this replica follows now
        self._registered: dict[str, str] = {}  # request id -> the lease whose leader holds a mirror of it
        self._provisional: set[str] = set()  # admitted here, not yet confirmed by a leader
        self._verdicts: dict[str, tuple[str, asyncio.Future[ErrorInfo | None]]] = {}  # rid -> (lease, verdict)
        self._tokens: dict[str, int] = {}  # request id -> tokens generated, not yet reported
        self._flush: asyncio.TimerHandle | None = None
        self.positions: dict[str, int] = {}  # request id -> its leader's last Position
        max_chars = max(
            (m.locality.block_chars * m.locality.max_blocks_per_request for m in scheduler.config.models), default=0
        )
        self._max_text = max(0, max_chars)

    def lease_of(self, model: str) -> str:
        return self._lease_of[model]

    def leader_of(self, model: str) -> str | None:
        """The holder string of the leader `model`'s requests are registered with (None: none yet, or not
        followed)."""
        return self.leaders.get(self._lease_of[model])

    def _leader_name(self, lease: str) -> str | None:
        holder = self.leaders.get(lease) if lease in self.following else None
        return holder.split("/", 1)[0] if holder else None

    def _follows(self, replica: str) -> bool:
        """Whether `replica` leads a lease this replica follows now (in whichever of its terms)."""
        return any(self._leader_name(lease) == replica for lease in self.following)

    # -- roles ---------------------------------------------------------------------------------------
    def follow(self, lease: str, holder: str | None) -> None:
        """Follow `holder` on `lease` (None: no leader yet); a new one gets every live ticket of the lease's
        models registered."""
        self.following.add(lease)
        if holder is not None and holder.split("/", 1)[0] == self._name:
            holder = None  # an earlier term of our own: never register with ourselves
        if holder == self.leaders.get(lease):
            return
        self.leaders[lease] = holder
        self._forget(lease)
        if holder is not None:
            self.register_all(lease)

    def stop_following(self, lease: str) -> None:
        """Leading the lease, or degraded: its requests are local tickets again; their pending verdicts are not
        awaited."""
        self.following.discard(lease)
        self.leaders[lease] = None
        self._forget(lease)
        for rid, (held_by, future) in list(self._verdicts.items()):
            if held_by != lease:
                continue
            if not future.done():
                future.set_result(None)  # admitted locally
            self._provisional.discard(rid)
            del self._verdicts[rid]

    def _forget(self, lease: str) -> None:
        """Nothing of the lease's requests is registered with any leader any more."""
        for rid in [rid for rid, held_by in self._registered.items() if held_by == lease]:
            del self._registered[rid]
            self._tokens.pop(rid, None)
            self.positions.pop(rid, None)

    def register_all(self, lease: str) -> None:
        """Send every live local ticket of the lease's models to its current leader, then their `Roster`.

        The leader may hold mirrors of ours that ended while we could not report their end: we were degraded
        (still a member, so it kept them) or followed nobody for a moment, and forgot which leader held what.
        The roster, behind the registrations on our inbox stream to the leader, has it end every mirror of
        ours for these models not in it; a request admitted after it registers after it, so no live request's
        mirror is ended."""
        to = self._leader_name(lease)
        if to is None:
            return
        live: list[str] = []
        for model in self._plan[lease]:
            for ticket in self._scheduler.dispatchers[model].cluster.live_tickets():
                self._register(ticket, force=ticket.request.request_id not in self._provisional)
                live.append(ticket.request.request_id)
        for part in roster(self._name, self._plan[lease], live):
            self._post(to, part)

    def _register(self, ticket: Ticket, *, force: bool) -> None:
        request = ticket.request
        lease = self._lease_of[request.model]
        to = self._leader_name(lease)
        if to is None:
            return
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
        self._registered[request.request_id] = lease
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
                end_user=request.end_user,
            ),
        )

    # -- admission (AdmissionGuard) --------------------------------------------------------------------
    async def confirm(self, ticket: Ticket) -> None:
        """Have the model's leader confirm a request just queued here (see the module docstring)."""
        lease = self._lease_of[ticket.request.model]
        if lease not in self.following:
            return  # leading its model, or degraded: admitted here, by this replica's own caps
        rid = ticket.request.request_id
        future: asyncio.Future[ErrorInfo | None] = asyncio.get_running_loop().create_future()
        self._verdicts[rid] = (lease, future)
        self._provisional.add(rid)
        self._register(ticket, force=False)
        try:
            async with asyncio.timeout(self._cluster.admission_wait_seconds):
                error = await asyncio.shield(future)
        except TimeoutError:
            log.info("cluster_admission_provisional", request_id=rid, leader=self._leader_name(lease))
            return
        finally:
            self._verdicts.pop(rid, None)
        if error is not None:
            raise rebuild_error(error)

    # -- messages from the leaders ---------------------------------------------------------------------
    def on_verdict(self, verdict: Verdict) -> None:
        rid = verdict.request_id
        waiting = self._verdicts.get(rid)
        future = None if waiting is None else waiting[1]
        if verdict.error is not None:
            self._registered.pop(rid, None)  # the leader holds nothing for it: its end is not reported
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
        leases = {lease for lease in self.following if self.leaders.get(lease) == grant.leader}
        if not leases:
            self._metrics.stale_grants.inc()
            if grant.sender != self._name and not self._follows(grant.sender):
                # A leader we do not follow (we are degraded, or it lost the lease) counts the request as
                # granted, in its engine budget, until it hears of its end, which we no longer report to it:
                # it ends its mirror now. Should we follow it again, we register the request anew.
                self._post(grant.sender, Report(self._name, grant.request_id, "ended", outcome=Outcome.CANCELLED.value))
            return
        for lease in leases:
            for model in self._plan[lease]:
                if self._scheduler.dispatchers[model].cluster.grant(
                    grant.request_id, grant.backend, grant.engine_priority
                ):
                    self.positions.pop(grant.request_id, None)
                    return
        self._metrics.stale_grants.inc()
        if any(d.cluster.running_ticket(grant.request_id) is not None for d in self._scheduler.dispatchers.values()):
            return  # a grant sent again after we took the first one (see Leader.on_admit): nothing to undo
        self._post(grant.sender, Report(self._name, grant.request_id, "ended", outcome=Outcome.CANCELLED.value))

    def on_fail(self, fail: Fail) -> None:
        outcome = Outcome.EXPIRED if fail.error.kind == QueueTimeout.__name__ else Outcome.FAILED
        self._registered.pop(fail.request_id, None)
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
    def _leader_of_request(self, rid: str) -> str | None:
        """The name of the replica holding the request's mirror (None: not registered with a leader now)."""
        lease = self._registered.get(rid)
        return None if lease is None else self._leader_name(lease)

    def _report(self, ticket: Ticket, kind: str, **fields: object) -> None:
        rid = ticket.request.request_id
        to = self._leader_of_request(rid)
        if to is not None:
            self._post(to, Report(self._name, rid, kind, **fields))  # type: ignore[arg-type]

    def on_accepted(self, ticket: Ticket) -> None:
        self._report(ticket, "accepted")

    def on_first_token(self, ticket: Ticket) -> None:
        self._report(ticket, "first_token")

    def on_generated(self, ticket: Ticket, tokens: int) -> None:
        rid = ticket.request.request_id
        if rid not in self._registered:
            return
        self._tokens[rid] = self._tokens.get(rid, 0) + tokens
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(
                self._cluster.report_interval_seconds, self._flush_tokens
            )

    def _flush_tokens(self) -> None:
        """Every pending count, one `Tokens` message per leader."""
        self._flush = None
        pending, self._tokens = self._tokens, {}
        counts: dict[str, dict[str, int]] = {}
        for rid, tokens in pending.items():
            to = self._leader_of_request(rid)
            if to is not None:
                counts.setdefault(to, {})[rid] = tokens
        for to, batch in counts.items():
            self._post(to, Tokens(self._name, batch))

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
        self._registered.pop(rid, None)

    def _send_tokens(self, ticket: Ticket) -> None:
        """Report a request's pending token count now (before an event that must come after it)."""
        rid = ticket.request.request_id
        tokens = self._tokens.pop(rid, 0)
        to = self._leader_of_request(rid)
        if tokens and to is not None:
            self._post(to, Tokens(self._name, {rid: tokens}))

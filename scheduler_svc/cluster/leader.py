"""The leader's side: every other replica's request of a model this replica leads held here as a mirror
ticket, so the leader's queues, fairness, caps, duplicate-id rule, locality and engine budget are the
cluster's for that model.

A mirror is admitted into the leader's own `Scheduler` (caps and the duplicate-id rule apply, or with
`force` they are skipped for a re-registration) and driven by the ordinary `RequestRun` with a remote
generation source: when the dispatcher assigns it, the source sends a `Grant` to the owner, then yields the
owner's reports as the adapter's events would have come (`Accepted`, `TextDelta("", n)` for the first token
and any count before it, `Finished`, or raises the reported `BackendError`, so the failover rule runs
unchanged); the counts after the first token go to the run's `count_tokens` at once. So all the accounting
(estimator, fairness, cost, metrics) is exactly a local request's. When the run fails (expired, no more
failover, shutting down) the owner gets a `Fail`.

A re-registered running request is `adopt`ed: assigned to its backend without a grant. A mirror ends
silently (nothing sent: the owner knows) when the owner reports its end, when the owner is dead (its
membership expired), when the owner's `Roster` (sent after it registers everything again: it followed anew
after being degraded) does not name it, or when this replica stops leading its model (the owners re-register
with the next leader).

Messages per mirrored request: Verdict (1) for a new request, Grant per attempt (1), Fail only when the
leader ends it, and for a client streaming its queue position one Position per move (rate-limited by
server.queue_update_interval_seconds, as the leader's own clients are told). Its own requests cost
nothing: they are local tickets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Collection, Iterable
from dataclasses import dataclass, field

import structlog

from backends.base import Accepted, Finished, GenerationEvent, GenerationRequest, SamplingParams, TextDelta
from backends.errors import BackendError
from scheduler_svc.cluster.messages import (
    Admit,
    Fail,
    Grant,
    Message,
    Position,
    Report,
    Roster,
    Tokens,
    Verdict,
    error_info,
    rebuild_error,
)
from scheduler_svc.core.errors import SchedulerError
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.core.request_run import Failed, Queued, RequestRun
from scheduler_svc.core.ticket import Outcome, Ticket, TicketState
from scheduler_svc.dispatch.scheduler import Scheduler

log = structlog.get_logger(__name__)

_Event = GenerationEvent | BackendError


@dataclass(eq=False)
class Mirror:
    """Another replica's request as the leader holds it."""

    owner: str
    ticket: Ticket
    created_at: float
    watch: bool = False  # the owner's client streams its queue position
    adopted: bool = False  # already running at the owner: the next dispatch sends no grant
    grant: Grant | None = None  # the last grant sent, until the owner reports it accepted
    silent: bool = False  # ended by us without telling the owner
    events: asyncio.Queue[_Event] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    run: RequestRun | None = None
    number: int = 0  # mirrors created before it (an owner's roster ends only mirrors older than itself)


@dataclass
class _RosterArriving:
    """An owner's roster whose parts are arriving."""

    models: frozenset[str]
    parts: int
    before: int  # the mirrors created when its first part arrived: only those older are its to end
    request_ids: set[str] = field(default_factory=set)
    next_part: int = 0


class Leader:
    """Mirror tickets and their drivers, for the models whose lease this replica holds."""

    def __init__(
        self,
        scheduler: Scheduler,
        name: str,
        holder: Callable[[str], str],
        post: Callable[[str, Message], None],
    ) -> None:
        self._scheduler = scheduler
        self._name = name
        self._holder = holder  # model -> the holder string of our term on its lease
        self._post = post
        self.mirrors: dict[str, Mirror] = {}
        self.leading: set[str] = set()  # the models this replica decides now
        self._created = 0  # mirrors created so far
        self._rosters: dict[str, _RosterArriving] = {}  # owner -> its roster, while its parts arrive

    def start(self, models: Iterable[str]) -> None:
        self.leading.update(models)

    def stop(self, models: Iterable[str]) -> None:
        """No longer leading `models`: drop their mirrors silently (their owners re-register with the next
        leader)."""
        stopped = set(models)
        self.leading -= stopped
        for mirror in list(self.mirrors.values()):
            if mirror.ticket.request.model in stopped:
                self._drop(mirror, Outcome.CANCELLED)

    # -- messages from owners ------------------------------------------------------------------------------
    def on_admit(self, admit: Admit) -> None:
        if admit.model not in self.leading or admit.sender == self._name:
            return  # sent to us as we stepped down (the owner re-registers with the next leader), or our own
        mirror = self.mirrors.get(admit.request_id)
        if mirror is not None:  # sent again (re-registration with the same leader)
            if admit.running is not None and mirror.ticket.state is TicketState.QUEUED:
                self._adopt(mirror, admit)
            elif admit.running is None and mirror.grant is not None and mirror.ticket.state is TicketState.DISPATCHED:
                # Still queued at its owner although granted: the first Admit reached this replica's inbox
                # while the owner followed another holder (our previous term), so it ignored our grant, and
                # only now registers with this term. Without the grant again both sides would wait forever.
                self._post(mirror.owner, mirror.grant)
            if not admit.force:
                self._post(admit.sender, Verdict(self._name, admit.request_id))
            return
        now = self._scheduler.clock.now()
        request = QueuedRequest(
            request_id=admit.request_id,
            model=admit.model,
            user=admit.user,
            priority_class=admit.priority_class,
            prompt=admit.text,
            messages=None,
            params=SamplingParams(max_tokens=admit.max_tokens),
            admitted_at=now - admit.age,
            deadline=None if admit.remaining is None else now + admit.remaining,
            prompt_chars=admit.prompt_chars,
            prompt_bytes=admit.prompt_bytes,
            client_request_id=admit.client_request_id,
            cache_key=admit.cache_key,
            end_user=admit.end_user,
            mirrored=True,
        )
        try:
            ticket = self._scheduler.admit(request, force=admit.force)
        except SchedulerError as exc:
            self._post(admit.sender, Verdict(self._name, admit.request_id, error_info(exc)))
            return
        mirror = Mirror(admit.sender, ticket, now, watch=admit.watch, number=self._created)
        self._created += 1
        self.mirrors[admit.request_id] = mirror
        if admit.running is not None:
            self._adopt(mirror, admit)
        mirror.task = asyncio.get_running_loop().create_task(self._drive(mirror), name=f"mirror:{admit.request_id}")
        if not admit.force:
            self._post(admit.sender, Verdict(self._name, admit.request_id))

    def _adopt(self, mirror: Mirror, admit: Admit) -> None:
        running = admit.running
        assert running is not None
        mirror.adopted = self._scheduler.dispatchers[admit.model].cluster.adopt(
            mirror.ticket,
            running.backend,
            running.engine_priority,
            running.attempt,
            accepted=running.accepted,
            first_token=running.first_token,
            tokens=running.tokens,
        )

    def on_report(self, report: Report) -> None:
        mirror = self.mirrors.get(report.request_id)
        if mirror is None or mirror.owner != report.sender:
            return
        if report.kind == "accepted":
            mirror.grant = None
            mirror.events.put_nowait(Accepted())
        elif report.kind == "first_token":
            mirror.events.put_nowait(TextDelta("", 0))
        elif report.kind == "error" and report.error is not None:
            mirror.grant = None
            error = rebuild_error(report.error)
            if not isinstance(error, BackendError):
                error = BackendError(str(error))
            mirror.events.put_nowait(error)
        elif report.kind == "ended":
            if report.outcome == Outcome.COMPLETED.value and mirror.ticket.state is TicketState.DISPATCHED:
                mirror.events.put_nowait(
                    Finished(report.finish_reason or "stop", report.prompt_tokens, report.completion_tokens)
                )
            else:
                self._drop(mirror, _outcome(report.outcome))

    def on_tokens(self, tokens: Tokens) -> None:
        """Counts of running requests. Once a mirror's run has taken its first token and has nothing else
        to take, a count is accounted at once (`RequestRun.count_tokens`), not woken through its event queue:
        the same accounting, for a fraction of the CPU of the many counts a leader takes."""
        for request_id, count in tokens.counts.items():
            mirror = self.mirrors.get(request_id)
            if mirror is None or mirror.owner != tokens.sender or not count:
                continue
            ticket = mirror.ticket
            started = ticket.state is TicketState.DISPATCHED and ticket.first_token_at is not None
            if started and mirror.run is not None and mirror.events.empty():
                mirror.run.count_tokens(count)
            else:
                mirror.events.put_nowait(TextDelta("", count))

    def on_roster(self, part: Roster) -> None:
        """An owner's live requests of some models, sent right after it registered them all with us. Once every
        part arrived, in order, its mirrors of those models that are older than the roster and not in it are
        of requests that ended while it could not report their end: they end now. A roster with a part
        missing or out of order ends nothing (the owner sends a whole one each time it registers again)."""
        if part.part == 0:
            self._rosters[part.sender] = _RosterArriving(frozenset(part.models), part.parts, self._created)
        arriving = self._rosters.pop(part.sender, None)
        if arriving is None or (part.part, part.parts, frozenset(part.models)) != (
            arriving.next_part,
            arriving.parts,
            arriving.models,
        ):
            return  # a part missing or out of order
        arriving.request_ids.update(part.request_ids)
        arriving.next_part += 1
        if arriving.next_part < arriving.parts:
            self._rosters[part.sender] = arriving
            return
        ended = [
            mirror
            for rid, mirror in self.mirrors.items()
            if mirror.owner == part.sender
            and mirror.number < arriving.before
            and mirror.ticket.request.model in arriving.models
            and rid not in arriving.request_ids
        ]
        for mirror in ended:
            self._drop(mirror, Outcome.CANCELLED)
        if ended:
            log.warning("cluster_unlisted_mirrors_released", owner=part.sender, mirrors=len(ended))

    def release_dead(self, members: Collection[str], read_since: float) -> int:
        """End the mirrors of owners that are no longer members (their process died); only those created
        before `read_since`, when the member list was read. Returns how many."""
        dead = [m for m in self.mirrors.values() if m.owner not in members and m.created_at < read_since]
        for mirror in dead:
            self._drop(mirror, Outcome.CANCELLED)
        if dead:
            log.warning("cluster_dead_owner_released", mirrors=len(dead), owners=sorted({m.owner for m in dead}))
        return len(dead)

    # -- the mirror's run ------------------------------------------------------------------------------
    async def _drive(self, mirror: Mirror) -> None:
        ticket = mirror.ticket
        run = mirror.run = self._scheduler.request_run(
            ticket, watch_positions=mirror.watch, generate=lambda t, g: self._remote(mirror, t, g)
        )
        try:
            async with contextlib.aclosing(run.events()) as events:
                async for event in events:
                    if isinstance(event, Queued) and not mirror.silent:
                        self._post(mirror.owner, Position(self._name, ticket.request.request_id, event.position))
                    elif isinstance(event, Failed) and not mirror.silent:
                        self._post(mirror.owner, Fail(self._name, ticket.request.request_id, error_info(event.error)))
        except Exception as exc:  # a bug: count it, end the mirror (its owner re-registers or ends it)
            self._scheduler.errors.report("cluster", exc, request_id=ticket.request.request_id)
            ticket.close(Outcome.FAILED)
        finally:
            if self.mirrors.get(ticket.request.request_id) is mirror:
                del self.mirrors[ticket.request.request_id]

    async def _remote(
        self, mirror: Mirror, ticket: Ticket, generation: GenerationRequest
    ) -> AsyncGenerator[GenerationEvent, None]:
        """The owner's generation as this leader sees it (see the module docstring)."""
        if mirror.adopted:
            mirror.adopted = False
        else:
            while not mirror.events.empty():  # leftovers of an earlier attempt
                mirror.events.get_nowait()
            assert ticket.backend is not None
            mirror.grant = Grant(
                sender=self._name,
                request_id=generation.request_id,
                backend=ticket.backend.name,
                engine_priority=ticket.engine_priority,
                attempt=ticket.attempts,
                leader=self._holder(ticket.request.model),
            )
            self._post(mirror.owner, mirror.grant)
        while True:
            event = await mirror.events.get()
            if isinstance(event, BackendError):
                raise event
            yield event
            if isinstance(event, Finished):
                return

    def _drop(self, mirror: Mirror, outcome: Outcome) -> None:
        """End a mirror without telling its owner."""
        mirror.silent = True
        mirror.ticket.close(outcome)
        if mirror.task is not None:
            mirror.task.cancel()
        if self.mirrors.get(mirror.ticket.request.request_id) is mirror:
            del self.mirrors[mirror.ticket.request.request_id]


def _outcome(value: str) -> Outcome:
    try:
        return Outcome(value)
    except ValueError:
        return Outcome.CANCELLED

"""A ticket holds one admitted request's state from the queue to its single final outcome.

It runs nothing: the request run (`request_run.RequestRun`, in the caller's task) waits on the ticket until
the dispatcher assigns a backend, then runs the generation. Whatever happens, `close()` records exactly one
outcome and gives back what the request held.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from typing import Protocol

from backends.base import Backend
from scheduler_svc.core.errors import ShuttingDown
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.core.tracing import RequestTrace

# gRPC's deadline timer and ours start a moment apart: a queued call cancelled this close to its deadline
# was cancelled by the deadline, not by its client.
DEADLINE_SLACK_SECONDS = 0.05


class Outcome(enum.Enum):
    """How an admitted request ended. Each request gets exactly one."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    REJECTED = "rejected"


class TicketState(enum.Enum):
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    DONE = "done"


class AssignedBackend(Protocol):
    """The backend a ticket was sent to, as far as the ticket, its run and the faces care: its name and its
    adapter (dispatch's `BackendHandle` is one; dispatch keeps the rest of it, gate and load estimate)."""

    @property
    def name(self) -> str: ...

    @property
    def backend(self) -> Backend: ...


class TicketHost(Protocol):
    """The one interface a ticket calls back on: its model's dispatch (`dispatch.request_events.RequestEvents`
    is it). Declared here, so that the ticket imports nothing of dispatch."""

    def now(self) -> float:
        """The clock's time."""
        ...

    def position(self, ticket: Ticket) -> int:
        """1-based position of `ticket` in its user's queue (0 once dispatched)."""
        ...

    def expire(self, ticket: Ticket) -> None:
        """End a queued ticket whose deadline passed."""
        ...

    def release(self, ticket: Ticket, outcome: Outcome) -> None:
        """The ticket is closing with `outcome`: take it out of its queue, or free its backend."""
        ...

    def settled(self, ticket: Ticket) -> None:
        """The ticket recorded its one outcome."""
        ...


class Ticket:
    """One admitted request's lifecycle: queued -> dispatched -> done.

    Slotted: one is held for every queued request, and slots save about 50 bytes of each against a dict."""

    __slots__ = (
        "_close_reason",
        "_host",
        "_woken",
        "_woken_early",
        "accepted_at",
        "attempts",
        "backend",
        "completion_tokens",
        "cut_outcome",
        "cut_reason",
        "dispatched_at",
        "dispatched_wall",
        "engine_priority",
        "finished_at",
        "first_token_at",
        "outcome",
        "request",
        "runner",
        "sent_at",
        "state",
        "trace",
        "watches_position",
    )

    def __init__(self, request: QueuedRequest, host: TicketHost) -> None:
        self.request = request
        self.trace: RequestTrace | None = None  # with `[tracing]` configured: set by admission
        self.state = TicketState.QUEUED
        self.outcome: Outcome | None = None
        self.backend: AssignedBackend | None = None
        self.dispatched_at: float | None = None
        self.dispatched_wall: float | None = None
        self.first_token_at: float | None = None
        self.sent_at: float | None = None  # when the (last) dispatch's request left for the engine
        self.accepted_at: float | None = None  # when the engine answered it
        self.finished_at: float | None = None
        self.completion_tokens = 0
        self.engine_priority: int | None = None
        self.attempts = 0  # dispatches so far: more than one after a failover
        self._host = host
        # made when a run first waits (an empty Event holds a deque: 0.8 KB for every queued request)
        self._woken: asyncio.Event | None = None
        self._woken_early = False  # what the Event would say while there is none
        self._close_reason: Exception | None = None
        self.runner: asyncio.Task[object] | None = None  # the task running the generation, while it runs
        self.cut_reason: Exception | None = None  # set when shutdown or a deadline cuts the running generation
        self.cut_outcome = Outcome.FAILED  # the outcome a cut generation ends with
        self.watches_position = False  # a streaming client wants to hear when its position changes

    # -- called by the dispatcher -------------------------------------------------------------------
    def assign(self, backend: AssignedBackend, now: float, engine_priority: int | None = None) -> None:
        """The dispatcher chose this request, a backend, and (for priority engines) its engine priority."""
        self.state = TicketState.DISPATCHED
        self.backend = backend
        self.engine_priority = engine_priority
        self.dispatched_at = now
        self.dispatched_wall = time.time()
        self.sent_at = self.accepted_at = None
        self.attempts += 1
        self._wake()

    def requeued(self) -> None:
        """The dispatcher put the request back in its queue after its backend failed it."""
        self.state = TicketState.QUEUED
        self.backend = None
        self.engine_priority = None
        self.dispatched_at = self.dispatched_wall = self.sent_at = self.accepted_at = None
        self._unwake()

    @property
    def engine_accept(self) -> float | None:
        """Seconds from the request leaving for the engine until the engine answered (None: not yet)."""
        if self.sent_at is None or self.accepted_at is None:
            return None
        return self.accepted_at - self.sent_at

    def nudge(self) -> None:
        """The request's position in its queue changed: wake the waiter, which re-reads it."""
        self._wake()

    @property
    def reached_engine(self) -> bool:
        """Whether an engine answered this request (its response started, or a token came): what it did
        for the request is then charged, while one that never got that far is refunded."""
        return self.accepted_at is not None or self.first_token_at is not None

    def cut(self, reason: Exception, outcome: Outcome = Outcome.FAILED) -> bool:
        """End a running generation now (shutdown's grace is over, or the call's deadline passed): the
        engine request is aborted, the caller gets `reason` instead of the rest of the answer and the ticket
        ends with `outcome`. False when nothing is running."""
        if self.state is not TicketState.DISPATCHED:
            return False
        self.cut_reason = reason  # a generation not started yet fails as it starts
        self.cut_outcome = outcome
        if self.runner is not None and not self.runner.done():
            self.runner.cancel()
        return True

    def end_in_queue(self, outcome: Outcome, reason: Exception) -> None:
        """Finish a request that never left the queue (expired, or the service is stopping)."""
        self._close_reason = reason
        self._record(outcome)
        self._wake()

    @property
    def woken(self) -> bool:
        """Whether the waiting run would wake now (dispatched, ended, or its position changed)."""
        return self._woken_early if self._woken is None else self._woken.is_set()

    def _wake(self) -> None:
        if self._woken is None:
            self._woken_early = True
        else:
            self._woken.set()

    def _unwake(self) -> None:
        if self._woken is None:
            self._woken_early = False
        else:
            self._woken.clear()

    # -- called by the request run ---------------------------------------------------------------------
    async def wait_dispatched(self, timeout: float | None) -> bool:
        """True once dispatched; False if `timeout` passed or a `nudge` came first. Raises if the request
        ended in the queue (QueueTimeout once its deadline passes: an expired request is never dispatched)."""
        if self.state is TicketState.QUEUED:
            deadline = self.request.deadline
            wait = timeout
            if deadline is not None:
                remaining = deadline - self._host.now()
                wait = remaining if wait is None else min(wait, remaining)
            if self._woken is None:
                self._woken = asyncio.Event()
                if self._woken_early:
                    self._woken.set()
            if wait is None or wait > 0:
                # asyncio.timeout, not wait_for: no extra task per wait, which adds up with 100k queued
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._woken.wait()
            if self.state is TicketState.QUEUED:
                self._woken.clear()  # woken by a nudge: the next wait must block again
                if deadline is None or self._host.now() < deadline:
                    return False
                self._host.expire(self)
        if self.state is TicketState.DISPATCHED:
            return True
        raise self._close_reason or ShuttingDown("request ended before dispatch")

    def position(self) -> int:
        """1-based position in the user's queue for this class (0 once dispatched)."""
        return self._host.position(self)

    def close(self, outcome: Outcome | None = None) -> None:
        """Record the final outcome (first call wins) and release the queue slot or the backend. Without an
        outcome the caller went away: CANCELLED, or EXPIRED for a queued request whose deadline had passed
        (gRPC cancels a call at its deadline, a moment before our own timer may fire)."""
        if self.state is TicketState.DONE:
            return
        if outcome is None:
            deadline = self.request.deadline
            expired = deadline is not None and self._host.now() >= deadline - DEADLINE_SLACK_SECONDS
            outcome = Outcome.EXPIRED if self.state is TicketState.QUEUED and expired else Outcome.CANCELLED
        self._host.release(self, outcome)
        self._record(outcome)

    def _record(self, outcome: Outcome) -> None:
        if self.state is TicketState.DONE:
            return
        self.state = TicketState.DONE
        self.outcome = outcome
        self.finished_at = self._host.now()
        self._host.settled(self)

"""One request run: an admitted request from its queue to its outcome, as an async iterator of events.

Every face consumes the same run (gRPC Submit and Stream today): it waits for the dispatcher, runs the
generation on the assigned backend in the caller's own task (so a cancelled call cancels the engine
request by plain asyncio cancellation), keeps the accounting as tokens stream, and when the backend fails
the request before its first token and the dispatcher queues it again (failover), waits for the next
dispatch. Events, in order:

    Queued*  (only when positions are watched: at the start, on every move, after a failover)
    Dispatched (once the engine took the request), Chunk*, then Done; or Failed, the last event, with the
    error to report (after a failover: Queued, Dispatched, ... again; an attempt the engine refused
    before taking it is not announced)

Errors the client should hear about (scheduler and backend errors) come as a `Failed` event; anything
else is a bug and propagates. Whatever happens, the ticket records exactly one outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from backends.base import Accepted, Finished, GenerationEvent, GenerationRequest, TextDelta
from backends.errors import BackendError
from scheduler_svc.core.errors import SchedulerError
from scheduler_svc.core.stream_pacing import NO_PACING, StreamPacing
from scheduler_svc.core.ticket import Outcome, Ticket, TicketState

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Queued:
    """The request waits at `position` in its user's queue (1-based, by the ordering policy)."""

    position: int


@dataclass(frozen=True, slots=True)
class Dispatched:
    """`backend` took the request (its `attempt`-th dispatch: more than one after a failover)."""

    backend: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """Generated text carrying `tokens` tokens."""

    text: str
    tokens: int


@dataclass(frozen=True, slots=True)
class Done:
    """The generation finished: why, and the engine's usage."""

    finish_reason: str
    prompt_tokens: int | None
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class Failed:
    """The request failed with an error its client is told about (the ticket's outcome is recorded)."""

    error: SchedulerError | BackendError


RunEvent = Queued | Dispatched | Chunk | Done | Failed


GenerationSource = Callable[[Ticket, GenerationRequest], AsyncGenerator[GenerationEvent, None]]
"""Where a dispatched ticket's generation events come from: its backend's adapter (`adapter_generation`), or
for a cluster leader's mirror of another replica's request, the events that replica reports."""


def adapter_generation(ticket: Ticket, generation: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
    """The generation on the ticket's assigned backend: the engine itself."""
    assert ticket.backend is not None
    return ticket.backend.backend.generate(generation)


class _Requeued(Exception):
    """The generation failed before its first token and the request is queued again (failover)."""


class RunHost(Protocol):
    """What a run reports to: its model's dispatch (`dispatch.request_events.RequestEvents` is it)."""

    def now(self) -> float:
        """The clock's time."""
        ...

    def on_accepted(self, ticket: Ticket) -> None: ...

    def on_first_token(self, ticket: Ticket) -> None: ...

    def on_generated(self, ticket: Ticket, tokens: int) -> None: ...

    def on_aborted(self, ticket: Ticket) -> None:
        """The ticket's open engine request was closed before its end (caller gone, or cut)."""
        ...

    def fail_over(self, ticket: Ticket, error: BackendError) -> bool:
        """Requeue a ticket its backend failed before the first token; False: it fails as it is."""
        ...


class RequestRun:
    """Drives one ticket to its outcome; `events()` is iterated once, by the caller's task."""

    def __init__(
        self,
        ticket: Ticket,
        host: RunHost,
        *,
        watch_positions: bool = False,
        generate: GenerationSource = adapter_generation,
        pacing: StreamPacing = NO_PACING,
    ) -> None:
        self.ticket = ticket
        self._host = host
        self._source = generate
        self._watch = watch_positions  # a streaming client hears of position changes
        self._pacing = pacing  # how often a long answer is read from the engine

    async def events(self) -> AsyncGenerator[RunEvent, None]:
        """The run's events (see the module docstring). Closing the iterator early (the caller left) ends
        the request as cancelled and aborts its engine request at once."""
        ticket = self.ticket
        position = 0
        try:
            if self._watch:
                position = ticket.position()
                ticket.watches_position = True  # the dispatcher nudges it when its position moves
                yield Queued(position)
            while True:  # more than once only when a backend fails the request before its first token
                while not await ticket.wait_dispatched(None):
                    if self._watch and (new_position := ticket.position()) != position and new_position > 0:
                        position = new_position
                        yield Queued(position)
                try:
                    # Closed as soon as this run is: closing the generation is what aborts the engine request.
                    async with contextlib.aclosing(self._generate()) as events:
                        async for event in events:
                            yield event
                except _Requeued:  # back at the head of the queue: say so, then wait for the next dispatch
                    if self._watch:
                        position = ticket.position()
                        yield Queued(position)
                    continue
                break
        except (SchedulerError, BackendError) as exc:
            yield Failed(exc)
        finally:
            ticket.close()

    def count_tokens(self, tokens: int) -> None:
        """Account `tokens` generated by the running attempt after its first token: what each `TextDelta`
        does, callable directly by a generation source whose counts need no event of their own (a cluster
        leader's mirror, told a count by the request's owner)."""
        self.ticket.completion_tokens += tokens
        self._host.on_generated(self.ticket, tokens)

    async def _generate(self) -> AsyncGenerator[Dispatched | Chunk | Done, None]:
        """Run the generation on the assigned backend, keeping the accounting as tokens stream.

        `Dispatched` comes once the engine has taken the request (its `Accepted`, or its first event from a
        source that sends none), not before the request leaves: telling the client (a gRPC message, an
        HTTP response's headers) would otherwise sit between the dispatch decision and the engine on every
        request's way, and that moment is when a latecomer's slot is won or lost. An attempt the engine
        refuses outright is never announced; the client hears of the one that got in."""
        ticket, host = self.ticket, self._host
        assert ticket.backend is not None and ticket.state is TicketState.DISPATCHED
        req = ticket.request
        generation = GenerationRequest(
            request_id=req.request_id,
            prompt=req.prompt,
            messages=req.messages,
            params=req.params,
            engine_priority=ticket.engine_priority,
            max_token_delay=self._pacing.engine_allowance(req.params.max_tokens),
            trace=req.trace_context if ticket.trace is None else ticket.trace.engine_context(),
        )
        shown = False  # whether the caller has seen any of this generation's text
        announced = False  # whether the caller has heard that the engine took it (Dispatched)
        finished = False  # whether the engine said the answer is complete
        if ticket.cut_reason is not None:
            ticket.close(ticket.cut_outcome)
            raise ticket.cut_reason
        ticket.runner = asyncio.current_task()
        ticket.sent_at = host.now()  # the adapter's first step is the request to the engine
        try:
            # Closed as soon as this generator is: the adapter's own close aborts the engine request. Left
            # to the garbage collector, it could go on generating for seconds after the client left.
            async with contextlib.aclosing(self._source(ticket, generation)) as events:
                async for event in events:
                    accepted = isinstance(event, Accepted)
                    if accepted:
                        host.on_accepted(ticket)
                    if not announced:
                        announced = True
                        yield Dispatched(ticket.backend.name, ticket.attempts)
                    if accepted:
                        continue
                    if isinstance(event, TextDelta):
                        if ticket.first_token_at is None:
                            ticket.first_token_at = host.now()
                            host.on_first_token(ticket)
                        self.count_tokens(event.tokens)
                        shown = True
                        yield Chunk(event.text, event.tokens)
                        if not event.last:  # the finish is in hand: its end is read at once
                            await self._pacing.pause(ticket.completion_tokens)
                    elif isinstance(event, Finished):
                        finished = True
                        # a busy engine merges tokens into one chunk: charge what its usage says was missed
                        missed = event.completion_tokens - ticket.completion_tokens
                        if missed > 0:
                            ticket.completion_tokens += missed
                            host.on_generated(ticket, missed)
                        shown = True
                        yield Done(event.finish_reason, event.prompt_tokens, event.completion_tokens)
        except asyncio.CancelledError:
            if not finished:
                host.on_aborted(ticket)  # the engine request, closed on the way out, is aborted there
            runner = ticket.runner
            if ticket.cut_reason is None or runner is None:
                ticket.close(Outcome.CANCELLED)
                raise
            runner.uncancel()  # our own cut, not the caller's: end with its status instead
            ticket.close(ticket.cut_outcome)
            raise ticket.cut_reason from None
        except GeneratorExit:
            if not finished:
                host.on_aborted(ticket)
            ticket.close(Outcome.CANCELLED)
            raise
        except BackendError as exc:
            if ticket.trace is not None:
                ticket.trace.error(host.now(), exc)
            try:
                requeued = not shown and host.fail_over(ticket, exc)
            except Exception:
                log.exception("failover_failed", request_id=req.request_id)
                requeued = False
            if requeued:
                raise _Requeued(str(exc)) from exc
            ticket.close(Outcome.FAILED)
            raise
        except BaseException:
            ticket.close(Outcome.FAILED)
            raise
        finally:
            ticket.runner = None
        ticket.close(Outcome.COMPLETED)

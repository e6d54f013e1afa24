"""The request run alone: its events in order, failover, errors and early close, on a fake clock with a
fake backend and a dispatcher driven by hand (no sockets)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

import pytest

from backends.base import Accepted, Finished, GenerationEvent, GenerationRequest, TextDelta
from backends.errors import BackendError, BackendUnavailable
from backends.fake import FakeBackend
from scheduler_svc.core.errors import ShuttingDown
from scheduler_svc.core.request_run import Chunk, Dispatched, Done, Failed, Queued, RequestRun, RunEvent
from scheduler_svc.core.stream_pacing import StreamPacing
from scheduler_svc.core.ticket import Outcome, TicketState
from tests.unit.dispatch_harness import Harness


class Engine:
    """A fake engine: each attempt runs the next script; a script is events, or an error to raise."""

    def __init__(self, *scripts: list[GenerationEvent | Exception]) -> None:
        self.scripts = list(scripts)
        self.closed = 0

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        script = self.scripts.pop(0)
        try:
            for step in script:
                if isinstance(step, Exception):
                    raise step
                yield step
        finally:
            self.closed += 1


def harness(engine: Engine, **model: object) -> Harness:
    h = Harness(model=dict(model) or None)
    h.handle.backend = FakeBackend(engine.generate)
    return h


ANSWER: list[GenerationEvent | Exception] = [Accepted(), TextDelta("he"), TextDelta("llo"), Finished("stop", 3, 2)]


async def test_a_watched_run_tells_its_position_then_streams_to_the_end() -> None:
    engine = Engine(ANSWER)
    h = harness(engine)
    h.submit("other")  # another user: dispatched with it, in no way ahead in its queue
    ticket = h.submit("u")
    h.submit("u")  # behind it in the same queue
    events = RequestRun(ticket, h.events, watch_positions=True).events()
    async with contextlib.aclosing(events):
        assert await anext(events) == Queued(1)
        h.dispatch()
        rest: list[RunEvent] = [event async for event in events]
    assert rest == [Dispatched("b0", 1), Chunk("he", 1), Chunk("llo", 1), Done("stop", 3, 2)]
    assert ticket.outcome is Outcome.COMPLETED and ticket.completion_tokens == 2
    assert ticket.first_token_at is not None and h.handle.estimator.in_flight == 2  # the two others
    assert engine.closed == 1


async def test_an_unwatched_run_yields_no_positions() -> None:
    h = harness(Engine(ANSWER))
    ticket = h.submit("u")
    h.dispatch()
    kinds = [type(event).__name__ async for event in RequestRun(ticket, h.events).events()]
    assert kinds == ["Dispatched", "Chunk", "Chunk", "Done"]


async def test_a_failure_before_the_first_token_queues_the_request_again() -> None:
    engine = Engine([Accepted(), BackendUnavailable("dropped")], ANSWER)
    h = harness(engine, failover_attempts=1, failover_cooldown_seconds=1.0)
    ticket = h.submit("u")
    events = RequestRun(ticket, h.events, watch_positions=True).events()
    async with contextlib.aclosing(events):
        assert await anext(events) == Queued(1)
        h.dispatch()
        assert await anext(events) == Dispatched("b0", 1)  # the engine took it, then dropped it
        assert await anext(events) == Queued(1)  # back at the head of its queue
        assert ticket.state is TicketState.QUEUED and h.dispatch() == []  # the backend cools down
        h.clock.advance(1.5)
        h.dispatch()
        rest = [event async for event in events]
    assert rest[0] == Dispatched("b0", 2) and rest[-1] == Done("stop", 3, 2)
    assert ticket.outcome is Outcome.COMPLETED and h.handle.estimator.in_flight == 0


async def test_an_attempt_the_engine_refused_is_never_announced() -> None:
    engine = Engine([BackendUnavailable("refused")], ANSWER)
    h = harness(engine, failover_attempts=1, failover_cooldown_seconds=1.0)
    ticket = h.submit("u")
    events = RequestRun(ticket, h.events, watch_positions=True).events()
    async with contextlib.aclosing(events):
        assert await anext(events) == Queued(1)
        h.dispatch()
        assert await anext(events) == Queued(1)  # no Dispatched for the refused attempt
        h.clock.advance(1.5)
        h.dispatch()
        rest = [event async for event in events]
    assert rest == [Dispatched("b0", 2), Chunk("he", 1), Chunk("llo", 1), Done("stop", 3, 2)]


async def test_dispatched_waits_for_the_engine_to_take_the_request() -> None:
    """The client hears `Dispatched` once the engine answered (not before the request left: that message
    would sit on the request's way to the engine); the accounting hears of the acceptance first."""
    sent = asyncio.Event()
    answer = asyncio.Event()

    async def slow_front_end(request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        sent.set()
        await answer.wait()
        for event in ANSWER:
            assert not isinstance(event, Exception)
            yield event

    h = Harness()
    h.handle.backend = FakeBackend(slow_front_end)
    ticket = h.submit("u")
    h.dispatch()
    events = RequestRun(ticket, h.events).events()
    async with contextlib.aclosing(events):
        first = asyncio.ensure_future(anext(events))
        async with asyncio.timeout(5):  # told before the request left (the old order), this would never come
            await sent.wait()  # the request is at the engine, which has not answered
        assert not first.done() and ticket.sent_at is not None and ticket.accepted_at is None
        answer.set()
        assert await first == Dispatched("b0", 1)
        assert ticket.accepted_at is not None  # on_accepted ran before the client was told
        rest = [event async for event in events]
    assert rest == [Chunk("he", 1), Chunk("llo", 1), Done("stop", 3, 2)]


async def test_a_source_without_acceptance_is_announced_before_its_first_event() -> None:
    h = harness(Engine([TextDelta("he"), Finished("stop", 3, 1)]))
    ticket = h.submit("u")
    h.dispatch()
    events = [event async for event in RequestRun(ticket, h.events).events()]
    assert events == [Dispatched("b0", 1), Chunk("he", 1), Done("stop", 3, 1)]


async def test_a_failure_after_text_is_the_last_event_and_fails_the_request() -> None:
    error = BackendError("engine died")
    h = harness(Engine([Accepted(), TextDelta("he"), error]))
    ticket = h.submit("u")
    h.dispatch()
    events = [event async for event in RequestRun(ticket, h.events).events()]
    assert events == [Dispatched("b0", 1), Chunk("he", 1), Failed(error)]
    assert ticket.outcome is Outcome.FAILED and h.handle.estimator.in_flight == 0


async def test_a_request_ended_in_the_queue_fails_with_its_reason() -> None:
    h = harness(Engine())
    ticket = h.submit("u")
    h.dispatcher.shutdown.reject_all_queued("stopping")
    events = [event async for event in RequestRun(ticket, h.events).events()]
    assert len(events) == 1 and isinstance(events[0], Failed) and isinstance(events[0].error, ShuttingDown)
    assert ticket.outcome is Outcome.REJECTED


@pytest.mark.parametrize(
    "seen",
    [
        [Dispatched("b0", 1)],  # `Dispatched` comes with the engine request open: leaving there closes it
        [Dispatched("b0", 1), Chunk("he", 1)],
    ],
)
async def test_closing_the_run_early_cancels_the_request_and_closes_the_engine_stream(seen: list[RunEvent]) -> None:
    engine = Engine(ANSWER)
    h = harness(engine)
    ticket = h.submit("u")
    h.dispatch()
    events = RequestRun(ticket, h.events).events()
    assert [await anext(events) for _ in seen] == seen
    assert engine.closed == 0  # the engine's stream is open
    await events.aclose()  # the caller left
    assert ticket.outcome is Outcome.CANCELLED and engine.closed == 1 and h.handle.estimator.in_flight == 0


async def test_paced_reads_never_hold_the_end_of_an_answer() -> None:
    """Between two chunks the run waits for the pacing grid, but not after a chunk the engine sent with its
    finish: the end of the answer (Done, the ticket's outcome, the freed slot) is read at once."""
    pauses: list[int] = []

    class RecordingPacing(StreamPacing):
        async def pause(self, tokens_so_far: int) -> None:
            pauses.append(tokens_so_far)

    answer: list[GenerationEvent | Exception] = [
        Accepted(),
        TextDelta("he"),
        TextDelta("llo", last=True),
        Finished("stop", 3, 2),
    ]
    h = harness(Engine(answer))
    ticket = h.submit("u")
    h.dispatch()
    events = [event async for event in RequestRun(ticket, h.events, pacing=RecordingPacing(0.05, 0)).events()]
    assert events[-1] == Done("stop", 3, 2) and ticket.outcome is Outcome.COMPLETED
    assert pauses == [1]  # after "he" only

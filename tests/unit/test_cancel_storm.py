"""Cancel storms on the fake clock: a caller leaves at every point a request passes (queued, chosen, being
sent, waiting for the engine's answer, at `Dispatched`, streaming), forced exactly, over many seeded rounds.

The engine here is a script that moves each request one step when the test says so and keeps what the
simulator's journal keeps (received, answered, tokens, how it ended), so the test can force the points a live
engine only hits by chance. After every round: no request is left open at the engine (an orphan), none a
caller left was finished there, every ticket has its one outcome, the backend holds nothing, the fairness
counter holds exactly what the engine did (prompt of the requests it answered, tokens it generated), and the
engine-abort counter says how many were closed at each stage. The live twin (both doors, the simulator's own
journal) is tests/service/test_cancel_storm_live.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import pytest

from backends.base import Accepted, Finished, GenerationEvent, GenerationRequest, TextDelta
from backends.fake import FakeBackend
from scheduler_svc.core.request_run import Chunk, Dispatched, RequestRun
from scheduler_svc.core.ticket import Outcome, Ticket, TicketState
from scheduler_svc.policies.fairness.activity import UserActivity
from tests.unit.dispatch_harness import Harness

ROUNDS = 300
SEED = 32
SLOTS = 3
ANSWER_TOKENS = 4
# Where a caller leaves; "never": it reads its answer to the end.
POINTS = ("queued", "chosen", "sending", "unanswered", "dispatched", "streaming", "never")


@dataclass
class Attempt:
    """One request at the engine, as a journal would show it."""

    received: bool = False  # the engine got it (a cancel before: it never starts there)
    answered: bool = False  # its response started (Accepted)
    tokens: int = 0
    end: str = ""  # finished, aborted (closed after it was received), dropped (closed on its way); "": open


class ScriptedEngine:
    """Generations that advance one step per `step(request_id)`: sent -> received -> answered -> tokens."""

    def __init__(self) -> None:
        self.attempts: dict[str, Attempt] = {}
        self._go: dict[str, asyncio.Event] = {}

    def step(self, request_id: str) -> None:
        self._go[request_id].set()

    async def _next(self, request_id: str) -> None:
        go = self._go[request_id]
        await go.wait()
        go.clear()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        rid = request.request_id
        attempt = self.attempts[rid] = Attempt()
        self._go[rid] = asyncio.Event()
        try:
            await self._next(rid)  # on its way
            attempt.received = True
            await self._next(rid)  # at the engine, its answer not sent yet
            attempt.answered = True
            yield Accepted()
            for _ in range(ANSWER_TOKENS):
                await self._next(rid)
                attempt.tokens += 1
                yield TextDelta("t")
            attempt.end = "finished"
            yield Finished("length", 1, ANSWER_TOKENS)
        finally:
            if not attempt.end:  # closed early: the connection goes, the engine drops the request
                attempt.end = "aborted" if attempt.received else "dropped"


@dataclass
class Caller:
    """One client: where it leaves, and how (its task cancelled, or the run closed at a yield)."""

    ticket: Ticket
    point: str
    closes: bool  # leaves by closing the run at the event of its point (a gRPC Stream closed at a yield)
    seen: list[object] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    left: bool = False

    async def consume(self, run: RequestRun) -> None:
        events = run.events()
        async with contextlib.aclosing(events):
            async for event in events:
                self.seen.append(event)
                at_point = (self.point == "dispatched" and isinstance(event, Dispatched)) or (
                    self.point == "streaming" and isinstance(event, Chunk)
                )
                if at_point and self.closes:
                    self.left = True
                    return


@pytest.fixture(autouse=True)
def _counters_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fairness keeps every user's state (no idle pruning), so the counter can be read after a round."""
    monkeypatch.setattr(UserActivity, "pruning", False)


STAGES = ("answered", "sent")  # llmsched_engine_aborts_total's stage label


def harness() -> tuple[Harness, ScriptedEngine]:
    """One backend with SLOTS slots, vtc_basic fairness, the scripted engine behind it."""
    h = Harness(scheduling={"fairness": "vtc_basic"}, cap=SLOTS)
    engine = ScriptedEngine()
    h.handle.backend = FakeBackend(engine.generate)
    return h, engine


def where(caller: Caller, engine: ScriptedEngine) -> str:
    """The point the caller's request is at now."""
    ticket = caller.ticket
    if ticket.state is TicketState.QUEUED:
        return "queued"
    attempt = engine.attempts.get(ticket.request.request_id)
    if attempt is None:
        return "chosen"
    if not attempt.received:
        return "sending"
    if not attempt.answered:
        return "unanswered"
    if not any(isinstance(event, Chunk) for event in caller.seen):
        return "dispatched" if any(isinstance(event, Dispatched) for event in caller.seen) else "answered"
    return "streaming"


async def settle() -> None:
    """Let every task run until each waits on the test again (no clock involved)."""
    for _ in range(20):
        await asyncio.sleep(0)


def cancel_if_due(callers: list[Caller], engine: ScriptedEngine, points: tuple[str, ...]) -> None:
    for caller in callers:
        if not caller.left and caller.point in points and where(caller, engine) == caller.point:
            if caller.closes and caller.point in ("dispatched", "streaming"):
                continue  # it leaves by itself, at the event
            caller.left = True
            assert caller.task is not None
            caller.task.cancel()


async def storm(rng: random.Random) -> dict[str, int]:
    """One round: a user's requests behind SLOTS slots, each caller leaving at its drawn point."""
    h, engine = harness()
    callers = []
    for _ in range(rng.randint(1, 12)):
        ticket = h.submit("u", max_tokens=ANSWER_TOKENS, prompt="p" * rng.randint(4, 400))
        caller = Caller(ticket, rng.choice(POINTS), closes=rng.random() < 0.5)
        caller.task = asyncio.create_task(caller.consume(RequestRun(ticket, h.events, watch_positions=True)))
        callers.append(caller)
    await settle()
    for _ in range(200):
        cancel_if_due(callers, engine, ("queued",))
        h.dispatch()
        cancel_if_due(callers, engine, ("chosen",))  # assigned, its run not resumed yet
        await settle()
        cancel_if_due(callers, engine, POINTS)
        await settle()
        for caller in callers:
            attempt = engine.attempts.get(caller.ticket.request.request_id)
            if not caller.left and attempt is not None and not attempt.end:
                engine.step(caller.ticket.request.request_id)
        await settle()
        h.clock.advance(0.01)
        if all(c.task is not None and c.task.done() for c in callers):
            break
    assert all(c.task is not None and c.task.done() for c in callers), "a caller never finished"

    attempts = engine.attempts
    left = [c for c in callers if c.point != "never"]
    orphans = [rid for rid, a in attempts.items() if not a.end]
    assert not orphans
    for caller in left:
        attempt = attempts.get(caller.ticket.request.request_id)
        assert attempt is None or attempt.end != "finished", caller.point
        assert caller.ticket.outcome is Outcome.CANCELLED, caller.point
        assert caller.left
    for caller in callers:
        if caller.point == "never":
            assert caller.ticket.outcome is Outcome.COMPLETED
            assert attempts[caller.ticket.request.request_id].end == "finished"
    # Nothing is held: the backend, the estimator's and the gauge's in-flight, the queue, the bytes.
    assert h.dispatcher.busy == 0 and h.handle.estimator.in_flight == 0
    assert h.dispatcher.snapshot("", 0).held_prompt_bytes == 0
    sample = h.metrics.registry.get_sample_value
    assert sample("llmsched_backend_in_flight", {"model": "m", "backend": "b0"}) == 0
    # Fairness charged what the engine did: the prompt of each request it answered, two per token (and
    # nothing is left pending: the counter is what was settled).
    done = {c.ticket.request.request_id: c.ticket for c in callers}
    charged = sum(done[rid].request.prompt_tokens_estimate + 2 * a.tokens for rid, a in attempts.items() if a.answered)
    assert h.counters("interactive").get("u", 0.0) == charged
    # The engine-abort counter: closed after the engine answered, or while being sent or answered.
    answered = sum(a.end == "aborted" and a.answered for a in attempts.values())
    sent = sum(a.end in ("aborted", "dropped") and not a.answered for a in attempts.values())
    aborts = [sample("llmsched_engine_aborts_total", {"model": "m", "backend": "b0", "stage": s}) or 0 for s in STAGES]
    assert aborts == [answered, sent]
    return {
        **{f"left {point}": sum(c.point == point for c in left) for point in POINTS[:-1]},
        "requests": len(callers),
        "left": len(left),
        "reached_engine": sum(a.received for a in attempts.values()),
        "aborted_at_engine": sum(a.end == "aborted" for a in attempts.values()),
        "orphans": len(orphans),
    }


async def test_a_caller_leaving_at_any_point_leaves_nothing_at_the_engine_and_charges_what_it_did() -> None:
    totals: dict[str, int] = {}
    for round_ in range(ROUNDS):
        rng = random.Random(SEED * 1_000_003 + round_)
        figures = await storm(rng)
        for key, value in figures.items():
            totals[key] = totals.get(key, 0) + value
    print(f"cancel storm (fake clock): {ROUNDS} rounds, {totals}")
    assert totals["orphans"] == 0
    assert all(totals[f"left {point}"] >= 50 for point in POINTS[:-1]), totals  # every point, many times
    assert totals["aborted_at_engine"] > 0 and totals["left"] > totals["aborted_at_engine"]


async def test_each_point_alone_ends_as_its_point_says() -> None:
    """One caller at each point: where the engine is left, and whether fairness charged it."""
    expected = {
        "queued": (None, 0),
        "chosen": (None, 0),
        "sending": ("dropped", 0),
        "unanswered": ("aborted", 0),
        "dispatched": ("aborted", 1),
        "streaming": ("aborted", 1),
    }
    for point, (end, charged_prompt) in expected.items():
        for closes in (False, True):
            h, engine = harness()
            ticket = h.submit("u", max_tokens=ANSWER_TOKENS, prompt="p" * 40)
            caller = Caller(ticket, point, closes=closes)
            caller.task = asyncio.create_task(caller.consume(RequestRun(ticket, h.events)))
            await settle()
            for _ in range(20):
                cancel_if_due([caller], engine, ("queued",))
                h.dispatch()
                cancel_if_due([caller], engine, ("chosen",))
                await settle()
                cancel_if_due([caller], engine, POINTS)
                await settle()
                attempt = engine.attempts.get(ticket.request.request_id)
                if not caller.left and attempt is not None and not attempt.end:
                    engine.step(ticket.request.request_id)
                await settle()
                if caller.task.done():
                    break
            attempt = engine.attempts.get(ticket.request.request_id)
            assert (attempt.end if attempt else None) == end, (point, closes)
            assert ticket.outcome is Outcome.CANCELLED
            tokens = attempt.tokens if attempt else 0
            charged = charged_prompt * ticket.request.prompt_tokens_estimate + 2 * tokens
            assert h.counters("interactive").get("u", 0) == charged

"""The gate in front of an engine whose HTTP front end is slow, replayed on a fake clock.

A busy front end (vLLM's API server sharing cores with its engine, or one process streaming for hundreds
of requests on a GPU host) hands requests to the engine late, streams tokens and ends late, and answers
`/metrics` seconds after the scrape was sent. The gate must still keep every slot busy while work is
queued, and keep the engine's own queue at or under its target when we are its only client.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from backends.base import BackendLoad
from scheduler_svc.config import GateConfig, PriorityClassConfig
from scheduler_svc.dispatch.load import LoadEstimator
from scheduler_svc.policies.gate import SignalGate

CLS = PriorityClassConfig(name="standard")
SLOTS, TARGET = 4, 3


@dataclass
class SlowFrontEndEngine:
    """An engine with `SLOTS` slots behind a front end that delays intake, output and metrics."""

    intake_lag: float  # sent -> the engine holds it (the response headers come back then)
    output_lag: float  # a token or an end at the engine -> the client sees it
    scrape_lag: float  # a scrape is taken at `read_at`, its answer arrives this much later
    decode: float  # how long a request runs once it has a slot
    events: list[tuple[float, str, str]] = field(default_factory=list)  # (when, kind, request id), client side
    waiting: deque[str] = field(default_factory=deque)
    running: dict[str, float] = field(default_factory=dict)  # request id -> when it ends at the engine

    def send(self, now: float, rid: str) -> None:
        self.events.append((now + self.intake_lag, "accepted", rid))

    def step(self, now: float) -> None:
        for rid, ends in list(self.running.items()):
            if ends <= now:
                del self.running[rid]
                self.events.append((now + self.output_lag, "finished", rid))
        while self.waiting and len(self.running) < SLOTS:
            rid = self.waiting.popleft()
            self.running[rid] = now + self.decode
            self.events.append((now + self.output_lag, "started", rid))


def replay(
    *, requests: int = 40, intake: float, output: float, scrape: float, decode: float = 2.0
) -> tuple[float, int, float]:
    """Run a flood through gate + ledger + engine at 10 ms steps.

    Returns (slot-seconds left empty while requests were queued at the scheduler, the engine's largest
    waiting queue, when the last request ended at the engine)."""
    engine = SlowFrontEndEngine(intake, output, scrape, decode)
    ledger = LoadEstimator(engine_slots=SLOTS)
    gate = SignalGate(GateConfig(waiting_target=TARGET, stale_after_seconds=1.0))
    queued = [f"r{i}" for i in range(requests)]
    pending_scrape: tuple[float, BackendLoad] | None = None
    next_scrape, empty, worst, last_end = 0.0, 0.0, 0, 0.0
    dt = 0.01
    for tick in range(int(200 / dt)):
        now = tick * dt
        for when, kind, rid in sorted(e for e in engine.events if e[0] <= now):
            engine.events.remove((when, kind, rid))
            if kind == "accepted":
                engine.waiting.append(rid)  # the engine holds it as its response starts
                ledger.accepted(rid, when)
            elif kind == "started":
                ledger.started(rid, when)
            else:
                ledger.finished(rid, when)
        engine.step(now)
        if engine.running:
            last_end = max(last_end, *engine.running.values())
        if pending_scrape is not None and pending_scrape[0] <= now:
            ledger.record_reading(pending_scrape[1])
            pending_scrape, next_scrape = None, now + 0.1
        if pending_scrape is None and now >= next_scrape:
            reading = BackendLoad(ok=True, read_at=now, waiting=len(engine.waiting), running=len(engine.running))
            pending_scrape = (now + scrape, reading)
        while queued and gate.decide(ledger.gate_inputs(now), CLS).open:
            rid = queued.pop(0)
            ledger.dispatched(rid)
            engine.send(now, rid)
        worst = max(worst, len(engine.waiting))
        if queued:
            empty += (SLOTS - len(engine.running)) * dt
        if not queued and not engine.events and not engine.running and not engine.waiting:
            break
    return empty, worst, last_end


def test_a_slow_front_end_and_late_scrapes_leave_no_slot_empty_while_work_is_queued() -> None:
    # /metrics answers 1.8 s late (every reading arrives stale), tokens and ends reach us 0.5 s late and
    # requests reach the engine 0.3 s after they were sent: before the fix the gate fell back to its
    # 4-in-flight cap, which counts requests still in the front end, and starved the engine.
    # (before: 28.9 slot-seconds empty and the flood ended at 27.5 s instead of about 20 s)
    empty, worst, last_end = replay(intake=0.3, output=0.5, scrape=1.8)
    assert worst <= TARGET
    assert empty < 3.0  # of 80 slot-seconds (40 x 2 s over 4 slots); the first intake alone costs 1.2
    assert last_end < 22.0


def test_late_scrapes_alone_do_not_lose_the_starts_and_ends_that_happened_while_they_were_answered() -> None:
    # A scrape that takes 0.6 s stays fresh enough (stale after 1 s), but the first tokens and ends that
    # arrived between its read_at and its answer must still count against it.
    empty, worst, _ = replay(intake=0.05, output=0.05, scrape=0.6)
    assert worst <= TARGET
    assert empty < 0.6  # before: 1.05 slot-seconds


def test_a_fast_front_end_keeps_the_queue_at_the_target_and_the_slots_full() -> None:
    empty, worst, _ = replay(intake=0.01, output=0.01, scrape=0.02)
    assert worst <= TARGET
    assert empty < 0.3


def test_first_tokens_seen_during_a_slow_scrape_count_against_it() -> None:
    """The exact events of the slow-scrape trace: starts between read_at and the answer are not lost."""
    ledger = LoadEstimator(engine_slots=SLOTS)
    for i in range(7):
        ledger.dispatched(f"r{i}")
        ledger.accepted(f"r{i}", 99.0)
    for i in range(4):
        ledger.started(f"r{i}", 99.5)
    ledger.record_reading(BackendLoad(ok=True, read_at=100.0, waiting=3, running=4))
    # the next scrape is taken at 100.2 and answers at 102.0; meanwhile three end and three start
    for i in range(3):
        ledger.finished(f"r{i}", 100.5)
    for i in range(4, 7):
        ledger.started(f"r{i}", 100.6)
    ledger.record_reading(BackendLoad(ok=True, read_at=100.2, waiting=3, running=4))
    inputs = ledger.gate_inputs(102.0)
    assert inputs.estimated_waiting() == 0  # the three it showed waiting have started since
    assert inputs.estimated_running() == 4

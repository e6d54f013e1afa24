"""The queue-depth gate and the dispatch ledger that feeds it, on an injected clock."""

from __future__ import annotations

from backends.base import BackendLoad
from scheduler_svc.config import GateConfig, PriorityClassConfig
from scheduler_svc.dispatch.load import LoadEstimator
from scheduler_svc.policies import QueueDepthGate, SignalGate

CLS = PriorityClassConfig()


def reading(at: float, waiting: int = 0, ok: bool = True) -> BackendLoad:
    return BackendLoad(ok=ok, read_at=at, waiting=waiting, running=0)


def send(ledger: LoadEstimator, rid: str, accepted_at: float | None) -> None:
    ledger.dispatched(rid)
    if accepted_at is not None:
        ledger.accepted(rid, accepted_at)


def test_target_three_with_zero_waiting_sends_exactly_three_without_a_new_scrape() -> None:
    gate, ledger = QueueDepthGate(GateConfig(waiting_target=3)), LoadEstimator()
    ledger.record_reading(reading(100.0, waiting=0))
    sent = 0
    while gate.decide(ledger.gate_inputs(100.1), CLS).open:
        sent += 1
        send(ledger, f"r{sent}", None)
        assert sent < 10
    assert sent == 3


def test_a_first_token_reopens_the_gate_before_the_next_scrape() -> None:
    gate, ledger = QueueDepthGate(GateConfig(waiting_target=3)), LoadEstimator()
    for i in range(3):
        send(ledger, f"r{i}", 99.0)
    ledger.record_reading(reading(100.0, waiting=3))  # the engine shows our three as waiting
    assert not gate.decide(ledger.gate_inputs(100.1), CLS).open
    ledger.started("r0")  # one of them got a slot
    decision = gate.decide(ledger.gate_inputs(100.1), CLS)
    assert decision.open and "waiting 2" in decision.reason


def test_a_start_of_one_that_was_already_running_does_not_reopen_the_gate() -> None:
    ledger = LoadEstimator()
    for i in range(4):  # four accepted before the scrape: three wait, one runs without a token yet
        send(ledger, f"r{i}", 99.0)
    ledger.record_reading(reading(100.0, waiting=3))
    ledger.started("r3")  # the running one's first token: the engine still has three waiting
    assert ledger.gate_inputs(100.1).estimated_waiting() == 3
    ledger.started("r0")
    assert ledger.gate_inputs(100.1).estimated_waiting() == 2


def test_requests_not_yet_accepted_or_accepted_after_the_reading_count_until_they_start() -> None:
    gate, ledger = QueueDepthGate(GateConfig(waiting_target=3)), LoadEstimator()
    send(ledger, "in-transit", None)  # sent before the scrape but the engine did not have it yet
    ledger.record_reading(reading(100.0, waiting=1))
    send(ledger, "after", 100.5)
    inputs = ledger.gate_inputs(100.6)
    assert inputs.estimated_waiting() == 3 and not gate.decide(inputs, CLS).open
    ledger.started("after")
    assert gate.decide(ledger.gate_inputs(100.6), CLS).open


def test_waiting_from_other_clients_keeps_the_gate_closed() -> None:
    gate, ledger = QueueDepthGate(GateConfig(waiting_target=3)), LoadEstimator()
    ledger.record_reading(reading(100.0, waiting=7))
    assert not gate.decide(ledger.gate_inputs(100.1), CLS).open


def test_stale_reading_falls_back_to_a_concurrency_cap() -> None:
    config = GateConfig(waiting_target=3, stale_after_seconds=1.0, fallback_max_in_flight=2)
    gate, ledger = QueueDepthGate(config), LoadEstimator()
    ledger.record_reading(reading(100.0, waiting=0))
    assert gate.decide(ledger.gate_inputs(100.5), CLS).fresh
    send(ledger, "a", 100.5)
    send(ledger, "b", 100.5)
    # Fresh reading: estimated waiting 2 < 3 keeps it open. Stale: the cap of 2 closes it.
    assert gate.decide(ledger.gate_inputs(100.9), CLS).open
    stale = gate.decide(ledger.gate_inputs(101.5), CLS)
    assert not stale.open and not stale.fresh and "stale" in stale.reason
    ledger.finished("a")
    assert gate.decide(ledger.gate_inputs(101.5), CLS).open  # not wedged: completions free the cap


def test_a_failed_scrape_keeps_the_last_good_reading_until_it_is_stale() -> None:
    gate, ledger = QueueDepthGate(GateConfig(waiting_target=3, stale_after_seconds=1.0)), LoadEstimator()
    ledger.record_reading(reading(100.0, waiting=5))
    ledger.record_reading(reading(100.2, ok=False))
    decision = gate.decide(ledger.gate_inputs(100.3), CLS)
    assert decision.fresh and not decision.open  # one lost scrape does not open the gate
    assert ledger.last_failure is not None
    assert not gate.decide(ledger.gate_inputs(101.5), CLS).fresh


def test_no_reading_at_all_uses_the_cap() -> None:
    gate, ledger = QueueDepthGate(GateConfig(fallback_max_in_flight=1)), LoadEstimator()
    assert gate.decide(ledger.gate_inputs(1.0), CLS).open
    send(ledger, "x", None)
    assert not gate.decide(ledger.gate_inputs(1.0), CLS).open


def test_running_estimate_follows_starts_finishes_and_unseen_requests() -> None:
    ledger = LoadEstimator()
    for rid in ("a", "b", "c"):
        send(ledger, rid, 99.0)
    ledger.started("a")
    ledger.record_reading(BackendLoad(ok=True, read_at=100.0, waiting=2, running=1))
    assert ledger.gate_inputs(100.1).estimated_running() == 1
    ledger.started("b")  # seen waiting, now running
    assert ledger.gate_inputs(100.1).estimated_running() == 2
    ledger.finished("a")  # seen running, now gone
    assert ledger.gate_inputs(100.1).estimated_running() == 1
    send(ledger, "d", None)  # not visible to the reading: counted as running to be safe
    assert ledger.gate_inputs(100.1).estimated_running() == 2


def test_an_end_the_reading_already_missed_does_not_lower_the_running_estimate() -> None:
    """The engine freed a slot, was scraped, and only then did its client see the stream end (seen on
    llama.cpp under load): the end must not be subtracted from a reading that no longer counts it."""
    ledger = LoadEstimator()
    for rid in ("a", "b", "c"):
        send(ledger, rid, 99.0)
        ledger.started(rid)
    ledger.record_reading(BackendLoad(ok=True, read_at=100.0, waiting=0, running=2))  # "a" already freed
    ledger.finished("a")
    assert ledger.gate_inputs(100.1).estimated_running() == 2  # "b" and "c", not 1
    batch = PriorityClassConfig("batch", max_engine_running=3)
    send(ledger, "d", None)
    assert not SignalGate(GateConfig()).decide(ledger.gate_inputs(100.1), batch).open


def test_a_class_limited_in_running_requests_leaves_slots_free() -> None:
    gate, ledger = QueueDepthGate(GateConfig()), LoadEstimator()
    batch = PriorityClassConfig("batch", max_engine_running=48, require_idle_engine=True)
    ledger.record_reading(BackendLoad(ok=True, read_at=100.0, waiting=0, running=47))
    assert SignalGate(GateConfig()).decide(ledger.gate_inputs(100.1), batch).open
    send(ledger, "x", None)
    ledger.started("x")  # running, and not yet in any reading
    decision = SignalGate(GateConfig()).decide(ledger.gate_inputs(100.1), batch)
    assert not decision.open and "running 48 >= 48" in decision.reason
    assert gate.decide(ledger.gate_inputs(100.1), CLS).open  # the queue-depth gate ignores the limit


def test_known_free_slots_are_not_counted_as_waiting() -> None:
    gate, ledger = QueueDepthGate(GateConfig(waiting_target=3)), LoadEstimator(engine_slots=64)
    ledger.record_reading(BackendLoad(ok=True, read_at=100.0, waiting=0, running=40))
    sent = 0
    while gate.decide(ledger.gate_inputs(100.1), CLS).open:
        sent += 1
        send(ledger, f"r{sent}", None)
        assert sent < 100
    assert sent == 24 + 3  # the 24 free slots, then the usual waiting target


def test_free_slots_earn_nothing_while_the_engine_shows_a_queue() -> None:
    ledger = LoadEstimator(engine_slots=64)
    ledger.record_reading(BackendLoad(ok=True, read_at=100.0, waiting=2, running=10))
    assert ledger.gate_inputs(100.1).estimated_waiting() == 2  # it is not admitting: trust the queue


def test_stale_metrics_never_let_a_class_past_its_running_limit() -> None:
    """A late scrape on a busy engine must not let batch take the slots it keeps free for better classes:
    with metrics stale, what we have in flight is all the gate knows runs, and the class limit holds."""
    batch = PriorityClassConfig("batch", rank=2, max_engine_running=3)
    gate = SignalGate(GateConfig(stale_after_seconds=1.0, fallback_max_in_flight=4))
    ledger = LoadEstimator(engine_slots=4)
    ledger.record_reading(reading(100.0, waiting=0))
    for rid in ("a", "b", "c"):
        send(ledger, rid, 100.1)
    stale = gate.decide(ledger.gate_inputs(102.0), batch)
    assert not stale.open and "cap 3" in stale.reason
    assert gate.decide(ledger.gate_inputs(102.0), CLS).open  # the fallback cap itself still allows a 4th

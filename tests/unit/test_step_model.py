"""The step-time model behind the TPOT signal, the TPOT check in the gate, and its config rules."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from backends.adapters.llamacpp import LlamaCppBackend
from backends.adapters.tgi import TgiBackend
from backends.adapters.vllm import VllmBackend
from backends.base import BackendCapabilities, BackendLoad
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.config import ConfigError, GateConfig, PriorityClassConfig
from scheduler_svc.core.ticket import TicketState
from scheduler_svc.dispatch.load import LoadEstimator
from scheduler_svc.policies import SignalGate
from scheduler_svc.policies.step_model import StepTimeModel
from tests.unit.dispatch_harness import Harness

INTERACTIVE = PriorityClassConfig("interactive", max_tpot_seconds=0.15)


def step(batch: float, base: float = 0.04, per_seq: float = 0.01) -> float:
    return base + per_seq * batch


def feed(model: StepTimeModel | SignalGate, at: float, running: int, tpot: float | None) -> None:
    model.observe(BackendLoad(ok=True, read_at=at, running=running, tpot_seconds=tpot))


def engine(batches: list[int], base: float = 0.04) -> list[tuple[int, float]]:
    """(running at the scrape, TPOT over the interval) of an engine whose batch moved linearly between
    scrapes: the interval's TPOT is the step at the mean of the two running counts."""
    out, previous = [], batches[0]
    for batch in batches:
        out.append((batch, step((previous + batch) / 2, base)))
        previous = batch
    return out


def feed_all(model: StepTimeModel, start: float, readings: list[tuple[int, float]], every: float = 0.2) -> None:
    for i, (running, tpot) in enumerate(readings):
        feed(model, start + i * every, running, tpot)


def test_it_learns_a_linear_step_from_readings_and_predicts_other_batches() -> None:
    model = StepTimeModel()
    feed_all(model, 10.0, engine([2, 2, 5, 5, 9, 9, 16, 16]))
    fit = model.fit()
    assert fit is not None and fit.learned
    assert fit.a == pytest.approx(0.04, abs=1e-6) and fit.b == pytest.approx(0.01, abs=1e-6)
    assert model.predict(11) == pytest.approx(0.15, abs=1e-6)


def test_until_learned_it_predicts_the_steepest_line_through_the_readings() -> None:
    model = StepTimeModel()
    assert model.predict(3) is None  # nothing seen: the gate allows its fallback cap in flight
    feed(model, 10.0, 4, step(4))  # 80 ms at 4
    fit = model.fit()
    assert fit is not None and not fit.learned
    predicted = model.predict(8)
    assert predicted == pytest.approx(0.16)  # proportional: above the truth (120 ms), never below
    assert predicted is not None and predicted >= step(8)


def test_it_follows_an_engine_that_gets_slower() -> None:
    model = StepTimeModel(half_life_seconds=10.0)
    feed_all(model, 10.0, engine([2, 2, 6, 6, 10, 10]), every=1.0)
    feed_all(model, 70.0, engine([2, 2, 6, 6, 10, 10] * 3, base=0.08), every=1.0)  # a minute later: fixed cost doubled
    assert model.predict(10) == pytest.approx(step(10, base=0.08), rel=0.03)


def test_beyond_the_largest_batch_seen_it_grows_no_faster_than_proportionally() -> None:
    model = StepTimeModel()
    feed_all(model, 10.0, engine([2, 2, 4, 4, 6, 6], base=0.06))  # a ramp: 80..120 ms, slope 10 ms
    fit = model.fit()
    assert fit is not None and fit.learned
    assert model.predict(6) == pytest.approx(0.12)
    assert model.predict(12) == pytest.approx(0.24)  # the line would say 180 ms: 2 x the step at 6 instead


def test_one_outlier_reading_does_not_swing_the_line() -> None:
    model = StepTimeModel()
    feed_all(model, 10.0, engine([2, 2, 6, 6, 10, 10] * 2))
    feed(model, 13.0, 10, 2.0)  # a GC pause: 2 s for one interval
    assert model.predict(11) == pytest.approx(step(11), rel=0.1)


def test_a_changing_batch_pairs_the_tpot_with_the_interval_mean() -> None:
    model = StepTimeModel()
    feed(model, 10.0, 0, None)
    feed(model, 10.2, 4, step(2))  # 0 -> 4 running during the interval: measured at about 2
    assert model.predict(2) == pytest.approx(step(2))


def gate_after(readings: list[tuple[int, float]]) -> tuple[SignalGate, LoadEstimator]:
    gate, ledger = SignalGate(GateConfig(waiting_target=100)), LoadEstimator(engine_slots=16)
    for i, (running, tpot) in enumerate(readings):
        load = BackendLoad(ok=True, read_at=10.0 + i * 0.2, running=running, tpot_seconds=tpot)
        ledger.record_reading(load)
        gate.observe(load)
    return gate, ledger


def fill(gate: SignalGate, ledger: LoadEstimator, now: float, cls: PriorityClassConfig = INTERACTIVE) -> int:
    sent = 0
    while gate.decide(ledger.gate_inputs(now), cls).open and sent < 100:
        ledger.dispatched(f"r{sent}")
        sent += 1
    return sent


def test_a_drained_engine_is_refilled_to_the_limits_batch_not_to_every_slot() -> None:
    # learned on the slow engine (16 running: 200 ms, 11: 150 ms); the wave ended, 2 still run
    gate, ledger = gate_after(engine([4, 8, 12, 16, 11, 11, 13, 9, 2, 2], base=0.0395))  # 11: 149.5 ms
    assert fill(gate, ledger, 12.0) == 9  # 2 + 9 = 11 running: 150 ms
    reason = gate.decide(ledger.gate_inputs(12.0), INTERACTIVE).reason
    assert "tpot at batch 12 predicted 160ms > 150ms" in reason


def test_before_any_tpot_reading_the_fallback_cap_holds() -> None:
    gate, ledger = gate_after([(0, 0.0)])  # tpot 0 is no reading
    assert fill(gate, ledger, 10.1) == GateConfig().fallback_max_in_flight
    assert "no tpot reading yet: in flight 4 >= cap 4" in gate.decide(ledger.gate_inputs(10.1), INTERACTIVE).reason


def test_requests_sent_but_not_yet_seen_count_in_the_predicted_batch() -> None:
    gate, ledger = gate_after(engine([4, 8, 12, 16, 11, 11, 13, 9, 10, 10]))
    ledger.dispatched("unseen")  # sent after the reading showed 10 running
    decision = gate.decide(ledger.gate_inputs(12.0), INTERACTIVE)
    assert not decision.open and "batch 12" in decision.reason


def test_a_class_without_a_limit_inherits_an_active_better_classs_limit() -> None:
    gate, ledger = gate_after(engine([4, 8, 12, 16, 11, 11, 13, 9, 11, 11]))
    batch = PriorityClassConfig("batch", rank=1)
    inputs = ledger.gate_inputs(12.0)
    assert gate.decide(inputs, batch).open  # interactive not around: batch may fill the engine
    held = gate.decide(inputs.__class__(**{**_fields(inputs), "better_tpot_limit": 0.15}), batch)
    assert not held.open and "for a better class (active)" in held.reason


def _fields(inputs: Any) -> dict[str, Any]:
    return {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs) if f.init}


def test_batch_is_held_to_interactives_tpot_while_interactive_is_active() -> None:
    h = Harness(
        scheduling={
            "default_class": "interactive",
            "classes": [
                {"name": "interactive", "rank": 0, "max_tpot_seconds": 0.15, "contention_window_seconds": 5.0},
                {"name": "batch", "rank": 1, "contention_window_seconds": 5.0},
            ],
        },
        model={"gate": {"waiting_target": 100}},
        cap=None,
    )
    for running, tpot in engine([4, 8, 12, 16, 11, 11, 13, 9, 1, 1], base=0.0395):
        h.reading(running=running, tpot=tpot)
        h.clock.advance(0.2)
    question = h.submit("alice", max_tokens=1)
    assert h.dispatch() == [question]
    h.step()
    assert question.state is TicketState.DONE
    for _ in range(20):
        h.submit("etl", priority_class="batch")
    h.reading(running=0)
    assert len(h.dispatch()) == 11  # 150 ms at 11, while interactive was active within 5 s
    h.clock.advance(5.1)
    h.reading(running=11)
    assert len(h.dispatch()) == 9  # interactive quiet for 5 s: batch is no longer held, the rest go


@pytest.mark.parametrize(
    ("kind", "adapter"), [("vllm", VllmBackend), ("tgi", TgiBackend), ("llamacpp", LlamaCppBackend)]
)
@pytest.mark.parametrize(
    ("limit", "value", "flag"), [("max_tpot_seconds", 0.1, "has_tpot"), ("max_kv_cache_usage", 0.9, "has_kv_usage")]
)
def test_config_validation_follows_each_adapters_capability_flags(
    kind: str, adapter: Any, limit: str, value: float, flag: str
) -> None:
    """A class limit on a signal is accepted exactly when the kind's adapter says it exports that signal."""
    caps: BackendCapabilities = adapter.CAPABILITIES
    config = raw("signals", kind, **{limit: value})
    if getattr(caps, flag):
        config_from_dict(config)
    else:
        with pytest.raises(ConfigError, match="does not export that signal"):
            config_from_dict(config)


def raw(policy: str = "signals", kind: str = "vllm", **cls: Any) -> dict[str, Any]:
    return {
        "scheduling": {"default_class": "i", "classes": [{"name": "i", **cls}]},
        "models": [{"name": "m", "gate": {"policy": policy}, "backends": [{"name": "b", "kind": kind}]}],
    }


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (raw("queue_depth", max_tpot_seconds=0.1), "sets max_tpot_seconds, which gate policy 'queue_depth'"),
        (raw("queue_depth", max_engine_running=4), "sets max_engine_running, which gate policy 'queue_depth'"),
        (raw(kind="tgi", max_kv_cache_usage=0.9), "(tgi) does not export that signal"),
        (raw(kind="llamacpp", max_kv_cache_usage=0.9), "(llamacpp) does not export that signal"),
    ],
)
def test_limits_the_gate_ignores_or_the_engine_cannot_observe_are_config_errors(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(config)
    assert message in str(err.value)


def test_queue_depth_without_class_limits_and_observable_limits_are_accepted() -> None:
    config_from_dict(raw("queue_depth", waiting_target=5, require_idle_engine=True))
    config_from_dict(raw(kind="tgi", max_tpot_seconds=0.1))
    config_from_dict(raw(kind="vllm", max_tpot_seconds=0.1, max_kv_cache_usage=0.9))

"""Conformance suite every registered gate must pass (like the fairness and ordering ones).

The contract: with metrics stale (old, failed or missing) a gate is blind, so it lets at most the fallback
cap in flight; it never opens while what the request would queue behind at the engine is at or over the
class's waiting target; each class limit it declares it honours (`honours`, read through
`ignored_limits`) closes it when exceeded and only then, and a limit it does not honour is refused by
config validation instead of being dropped; every decision carries a reason.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.base import BackendLoad
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.config import ConfigError, GateConfig, PriorityClassConfig
from scheduler_svc.policies import GATE_POLICIES, Gate, GateInputs
from scheduler_svc.policies import gate as gate_module
from scheduler_svc.policies.gate import CLASS_LIMITS, ignored_limits
from scheduler_svc.policies.registry import Registry

POLICIES = sorted(GATE_POLICIES.describe())
CONFIG = GateConfig(waiting_target=3, stale_after_seconds=1.0, fallback_max_in_flight=4)
NOW = 100.0


def gate(name: str, config: GateConfig = CONFIG) -> Gate:
    return GATE_POLICIES.create(name, config)


def inputs(reading: BackendLoad | None, now: float = NOW + 0.1, **kwargs: Any) -> GateInputs:
    fields: dict[str, Any] = {"in_flight": 0, "sent_unseen": 0, "started_since_reading": 0, **kwargs}
    return GateInputs(reading=reading, now=now, **fields)


def reading(waiting: int = 0, running: int = 0, **kwargs: Any) -> BackendLoad:
    return BackendLoad(ok=True, read_at=NOW, waiting=waiting, running=running, **kwargs)


def honoured(policy: str) -> list[str]:
    """The class limits `policy` acts on (a class setting any other is a config error with it)."""
    # Every limit set by name to 1 (true for the flag), on purpose: the list is CLASS_LIMITS, whatever it holds.
    everything = PriorityClassConfig(**{name: 1 for name in CLASS_LIMITS})  # type: ignore[arg-type]
    ignored = set(ignored_limits(policy, everything))
    return [name for name in CLASS_LIMITS if name not in ignored]


HONOURED = [(policy, limit) for policy in POLICIES for limit in CLASS_LIMITS if limit in honoured(policy)]
IGNORED = [(policy, limit) for policy in POLICIES for limit in CLASS_LIMITS if limit not in honoured(policy)]
# a plain class, and one per honoured limit (a TPOT limit takes its own path before any TPOT reading)
STALE_CASES = [(policy, PriorityClassConfig()) for policy in POLICIES] + [
    (policy, PriorityClassConfig(max_tpot_seconds=0.1)) for policy, limit in HONOURED if limit == "max_tpot_seconds"
]


@pytest.mark.parametrize(("policy", "cls"), STALE_CASES)
@pytest.mark.parametrize(
    "stale",
    [
        pytest.param(lambda: reading(), id="old-reading"),
        pytest.param(lambda: BackendLoad(ok=False, read_at=NOW + 1.5, error="refused"), id="failed-scrape"),
        pytest.param(lambda: None, id="no-reading"),
    ],
)
def test_stale_metrics_let_no_more_than_the_fallback_cap_in_flight(
    policy: str, stale: Any, cls: PriorityClassConfig
) -> None:
    g = gate(policy)
    now = NOW + CONFIG.stale_after_seconds + 1.0  # the good reading, if any, is now too old to trust
    for in_flight in range(CONFIG.fallback_max_in_flight, CONFIG.fallback_max_in_flight + 3):
        decision = g.decide(inputs(stale(), now=now, in_flight=in_flight), cls)
        assert not decision.open and not decision.fresh and decision.reason
    below = g.decide(inputs(stale(), now=now, in_flight=CONFIG.fallback_max_in_flight - 1), PriorityClassConfig())
    assert below.open and below.reason  # blind, not stuck: a dead metrics endpoint degrades to a cap


@dataclass(frozen=True)
class LimitCase:
    """One class limit, a reading that breaks it and one that keeps it (other inputs as given)."""

    cls: PriorityClassConfig
    breaks: BackendLoad
    keeps: BackendLoad
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


LIMIT_CASES = {
    "waiting_target": LimitCase(PriorityClassConfig(waiting_target=2), reading(waiting=2), reading(waiting=1)),
    "require_idle_engine": LimitCase(PriorityClassConfig(require_idle_engine=True), reading(waiting=1), reading()),
    "max_engine_running": LimitCase(PriorityClassConfig(max_engine_running=2), reading(running=2), reading(running=1)),
    "max_engine_running_when_contended": LimitCase(
        PriorityClassConfig(max_engine_running_when_contended=1),
        reading(running=1),
        reading(running=0),
        {"better_class_active": True},
    ),
    "max_tpot_seconds": LimitCase(
        PriorityClassConfig(max_tpot_seconds=0.1),
        reading(running=4, tpot_seconds=0.2),
        reading(running=1, tpot_seconds=0.01),
    ),
    "max_kv_cache_usage": LimitCase(
        PriorityClassConfig(max_kv_cache_usage=0.8),
        reading(kv_cache_usage=0.9),
        reading(kv_cache_usage=0.5),
    ),
}


def test_every_class_limit_has_a_case() -> None:
    assert set(LIMIT_CASES) == set(CLASS_LIMITS)


@pytest.mark.parametrize(("policy", "limit"), HONOURED)
def test_a_limit_the_gate_honours_closes_it_exactly_when_broken(policy: str, limit: str) -> None:
    case = LIMIT_CASES[limit]
    for load, should_open in ((case.breaks, False), (case.keeps, True)):
        g = gate(policy)  # a fresh gate per reading: what it learned from one must not leak into the other
        g.observe(dataclasses.replace(load, read_at=NOW - 1.0))
        g.observe(load)
        decision = g.decide(inputs(load, **case.extra), case.cls)
        assert decision.open is should_open, f"{limit}: {decision.reason}"
        assert decision.fresh and decision.reason


@pytest.mark.parametrize(("policy", "limit"), IGNORED)
def test_a_limit_the_gate_would_ignore_is_a_config_error(policy: str, limit: str) -> None:
    value = getattr(LIMIT_CASES[limit].cls, limit)
    raw = {
        "scheduling": {"classes": [{"name": "interactive", "rank": 0, limit: value}]},
        "models": [{"name": "m", "gate": {"policy": policy}, "backends": [{"name": "b0"}]}],
    }
    with pytest.raises(ConfigError, match=limit):
        config_from_dict(raw)


def test_a_gate_registered_without_declaring_its_limits_honours_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gate added straight through the registry, with no `honours`, must not let limits pass unchecked."""

    class Undeclared:
        def __init__(self, config: GateConfig) -> None:
            self.config = config

    registry: Registry[Gate] = Registry("gate")  # a private copy: the process-wide registry stays as it is
    # Undeclared lacks what a Gate declares, on purpose: the registry must cope with such a gate.
    registry.register("undeclared_test_gate", Undeclared, "a test gate that declares no limits")  # type: ignore[arg-type]
    monkeypatch.setattr(gate_module, "GATE_POLICIES", registry)
    cls = PriorityClassConfig("interactive", max_tpot_seconds=0.1, waiting_target=2)
    assert ignored_limits("undeclared_test_gate", cls) == ["waiting_target", "max_tpot_seconds"]


_inputs: st.SearchStrategy[dict[str, Any]] = st.builds(
    dict,
    waiting=st.integers(0, 12),
    running=st.integers(0, 12),
    in_flight=st.integers(0, 12),
    sent_unseen=st.integers(0, 4),
    started_since_reading=st.integers(0, 4),
    engine_slots=st.sampled_from([0, 4, 8]),
    candidate_priority=st.one_of(st.none(), st.integers(0, 3)),
    unstarted_priorities=st.lists(st.integers(0, 3), max_size=4).map(lambda p: tuple(sorted(p))),
    class_target=st.integers(0, 5),
    require_idle=st.booleans(),
    age=st.sampled_from([0.1, 0.9, 5.0]),
)


def model_target(gi: GateInputs) -> int:
    """The model's target for the candidate: `waiting_target`, and at a priority engine (a candidate with a
    priority) 1.5 x the engine's slots when known, at least that (`CONFIG` leaves it to be derived)."""
    if gi.candidate_priority is None or not gi.engine_slots:
        return CONFIG.waiting_target
    return max(CONFIG.waiting_target, -(-3 * gi.engine_slots // 2))


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=300, deadline=None)
@given(drawn=_inputs)
def test_never_opens_with_the_queue_ahead_at_or_over_the_target(policy: str, drawn: dict[str, Any]) -> None:
    """Whatever the engine shows and we sent: an open gate with fresh metrics means fewer than the target
    ahead of the request (none at all for a class that needs an idle engine queue); every decision has a
    reason. At a priority engine the target is 1.5 x its slots, `waiting_target` while they are unknown."""
    g = gate(policy)
    load = reading(waiting=drawn["waiting"], running=drawn["running"])
    g.observe(load)
    unstarted = max(len(drawn["unstarted_priorities"]), drawn["sent_unseen"])
    gi = inputs(
        load,
        now=NOW + drawn["age"],
        in_flight=max(drawn["in_flight"], unstarted),
        sent_unseen=drawn["sent_unseen"],
        started_since_reading=drawn["started_since_reading"],
        engine_slots=drawn["engine_slots"],
        candidate_priority=drawn["candidate_priority"],
        unstarted=unstarted,
        unstarted_priorities=drawn["unstarted_priorities"],
    )
    limit = "require_idle_engine" if drawn["require_idle"] else "waiting_target"
    if limit not in honoured(policy):
        return
    cls = PriorityClassConfig(waiting_target=drawn["class_target"], require_idle_engine=drawn["require_idle"])
    decision = g.decide(gi, cls)
    assert decision.reason
    if decision.open and decision.fresh:
        if cls.require_idle_engine:
            assert gi.estimated_waiting() == 0
        else:
            assert gi.waiting_ahead() < (cls.waiting_target or model_target(gi))
    if not decision.fresh:
        assert drawn["age"] > CONFIG.stale_after_seconds
        assert not decision.open or gi.in_flight < CONFIG.fallback_max_in_flight

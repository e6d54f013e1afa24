"""The walks the scale work removed, put back for a side-by-side measure: a baseline the bench alone uses.

- `<policy>_scan`: a counter fairness policy whose account answers from `BacklogScan` (a walk over every
  backlogged user for each choice, lift and floor) instead of the index;
- `signals_every_pass`: the `signals` gate without its `ReusableGate` promise, so every pass asks every
  backend's gate again.

Round robin keeps its own ring either way. What is not put back: a user's eligibility read through every
backend's engine priority (the old key of a per-dispatch answer), so the baseline costs less than the code
before the change did; the issue's table of figures measured from outside stands for that.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from bench.product import (
    FAIRNESS_POLICIES,
    GATE_POLICIES,
    BackendLoad,
    BacklogScan,
    CounterAccount,
    Fairness,
    GateConfig,
    GateDecision,
    GateInputs,
    PriorityClassConfig,
    SignalGate,
    WeightResolver,
)

SCANNED = ("vtc", "vtc_basic", "weighted_round_robin")
EVERY_PASS = "signals_every_pass"


def scan_name(policy: str) -> str:
    return f"{policy}_scan" if policy in SCANNED else policy


class EveryPassGate:
    """The `signals` gate, asked again at every pass (it does not say when its answer could change)."""

    honours = SignalGate.honours

    def __init__(self, config: GateConfig) -> None:
        self._gate = SignalGate(config)

    def observe(self, reading: BackendLoad) -> None:
        self._gate.observe(reading)

    def decide(self, inputs: GateInputs, priority_class: PriorityClassConfig) -> GateDecision:
        return self._gate.decide(inputs, priority_class)


def _scanning(policy: str) -> Any:
    build = FAIRNESS_POLICIES.factory(policy)
    assert build is not None

    def build_scanning(params: Any, weights: WeightResolver, clock: Any) -> Fairness:
        fairness: Fairness = build(params, weights, clock)
        account = fairness.account
        assert isinstance(account, CounterAccount)
        account.use_order(BacklogScan())
        return fairness

    return build_scanning


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """The baseline policies registered while the block runs."""
    for policy in SCANNED:
        params = type(FAIRNESS_POLICIES.params(policy, {}))
        FAIRNESS_POLICIES.register(
            scan_name(policy), _scanning(policy), f"{policy}, walking the backlog", params=params
        )
    GATE_POLICIES.register(EVERY_PASS, EveryPassGate, "signals, asked again at every pass")
    try:
        yield
    finally:
        for policy in SCANNED:
            FAIRNESS_POLICIES.unregister(scan_name(policy))
        GATE_POLICIES.unregister(EVERY_PASS)

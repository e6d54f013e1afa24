"""Gates (saturation detectors): may one more request of a class go to this backend now?

A gate sees only the backend's last `BackendLoad` reading and the scheduler's own bookkeeping of what it
sent since (`GateInputs`); it never talks to an engine. The same gate serves every engine kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from backends.base import BackendLoad
from scheduler_svc.config import GateConfig, PriorityClassConfig
from scheduler_svc.policies.registry import Registry


@dataclass(frozen=True, slots=True)
class GateInputs:
    """Everything a gate may base its decision on.

    `sent_unseen`: requests dispatched after the reading was taken that have not produced a token yet (the
    engine holds them, the reading cannot show them). `started_since_reading`: requests dispatched before
    the reading that produced their first token after it, so the reading's waiting count is that much too
    high now.
    """

    reading: BackendLoad | None
    now: float
    in_flight: int
    sent_unseen: int
    started_since_reading: int

    def reading_age(self) -> float | None:
        """Seconds since the reading was taken, None when there is none."""
        return None if self.reading is None else self.now - self.reading.read_at

    def estimated_waiting(self) -> int:
        """The engine's waiting queue now, as best we know: last reading corrected by what happened since."""
        seen = self.reading.waiting if self.reading is not None and self.reading.ok else 0
        return max(0, seen - self.started_since_reading) + self.sent_unseen


@dataclass(frozen=True, slots=True)
class GateDecision:
    """The gate's answer with the reason, for logs, metrics and introspection."""

    open: bool
    reason: str
    fresh: bool


class Gate(Protocol):
    """Decides whether a backend may take one more request of a class."""

    def decide(self, inputs: GateInputs, priority_class: PriorityClassConfig) -> GateDecision:
        """Open or closed, and why."""
        ...


class QueueDepthGate:
    """Keep the engine's own waiting queue short, so ordering stays in the scheduler's hands.

    Open while estimated waiting < `waiting_target` (with a reading of 0 and a target of 3, three requests
    go at once). Fallback: a reading older than `stale_after_seconds`, or a failed scrape, no longer opens
    the gate; the backend then gets at most `fallback_max_in_flight` requests in flight, so a dead metrics
    endpoint degrades to a concurrency cap instead of a flood (blind dispatch) or a stall (wedged model).
    """

    def __init__(self, config: GateConfig) -> None:
        self._config = config

    def decide(self, inputs: GateInputs, priority_class: PriorityClassConfig) -> GateDecision:
        age = inputs.reading_age()
        fresh = (
            inputs.reading is not None
            and inputs.reading.ok
            and age is not None
            and age <= self._config.stale_after_seconds
        )
        if not fresh:
            cap = self._config.fallback_max_in_flight
            if inputs.in_flight < cap:
                return GateDecision(True, f"metrics stale: in flight {inputs.in_flight} < cap {cap}", False)
            return GateDecision(False, f"metrics stale: in flight {inputs.in_flight} >= cap {cap}", False)
        waiting = inputs.estimated_waiting()
        target = self._config.waiting_target
        if waiting < target:
            return GateDecision(True, f"waiting {waiting} < target {target}", True)
        return GateDecision(False, f"waiting {waiting} >= target {target}", True)


GATE_POLICIES: Registry[Gate] = Registry("gate")
GATE_POLICIES.register(
    "queue_depth",
    QueueDepthGate,
    "engine waiting queue below a target; concurrency cap when metrics are stale",
)

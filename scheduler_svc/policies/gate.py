"""Gates (saturation detectors): may one more request of a class go to this backend now?

A gate sees only the backend's last `BackendLoad` reading and the scheduler's own bookkeeping of what it
sent since (`GateInputs`); it never talks to an engine. The same gate serves every engine kind.
"""

from __future__ import annotations

from collections.abc import Callable
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
    unseen_in_flight: int = 0
    finished_since_reading: int = 0
    engine_slots: int = 0
    better_class_active: bool = False  # a better-ranked class was active recently (see contention window)
    started_in_flight: int = 0  # ours that produced a token and have not ended: running at the engine

    def reading_age(self) -> float | None:
        """Seconds since the reading was taken, None when there is none."""
        return None if self.reading is None else self.now - self.reading.read_at

    def _seen_running(self) -> int:
        """The reading's running count moved on by what started and finished since."""
        seen = self.reading.running if self.reading is not None and self.reading.ok else 0
        return max(0, seen + self.started_since_reading - self.finished_since_reading)

    def estimated_running(self) -> int:
        """Requests the engine is running now, at most: the seen running count plus every request of ours
        the reading cannot show (counted as running, to be safe), and never fewer than ours known to run.

        The floor matters because an engine frees a slot a moment before its client sees the stream end: a
        scrape taken in between no longer counts the request, and its end, seen after the reading, would
        be subtracted a second time.
        """
        return max(self._seen_running() + self.unseen_in_flight, self.started_in_flight + self.sent_unseen)

    def estimated_waiting(self) -> int:
        """The engine's waiting queue now, as best we know: last reading corrected by what happened since.

        With the engine's slot count known and a reading that showed nothing waiting (the engine was
        admitting freely), requests that fit into its free slots are not counted as waiting.
        """
        seen = self.reading.waiting if self.reading is not None and self.reading.ok else 0
        waiting = max(0, seen - self.started_since_reading) + self.sent_unseen
        if not self.engine_slots or seen > 0 or self.reading is None:
            return waiting
        started_unseen = self.unseen_in_flight - self.sent_unseen
        running = max(self._seen_running() + started_unseen, self.started_in_flight)  # see estimated_running
        free = max(0, self.engine_slots - running)
        return max(0, waiting - free)


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


def _fallback(inputs: GateInputs, config: GateConfig, cls: PriorityClassConfig) -> GateDecision | None:
    """Without a fresh reading the gate cannot see the engine: allow a small number in flight only, and no
    more than the class's running limit (what we have in flight is then all we know the engine runs: a
    late scrape must not let batch work take the slots it leaves free for better classes)."""
    age = inputs.reading_age()
    if inputs.reading is not None and inputs.reading.ok and age is not None and age <= config.stale_after_seconds:
        return None
    cap = config.fallback_max_in_flight
    if limit := running_limit(inputs, cls):
        cap = min(cap, limit)
    if inputs.in_flight < cap:
        return GateDecision(True, f"metrics stale: in flight {inputs.in_flight} < cap {cap}", False)
    return GateDecision(False, f"metrics stale: in flight {inputs.in_flight} >= cap {cap}", False)


def check_waiting(inputs: GateInputs, cls: PriorityClassConfig, config: GateConfig) -> str | None:
    """The engine's waiting queue must stay below the class's target (batch: must be empty)."""
    waiting = inputs.estimated_waiting()
    if cls.require_idle_engine:
        return None if waiting == 0 else f"waiting {waiting} > 0 and {cls.name} needs an idle engine queue"
    target = cls.waiting_target or config.waiting_target
    return None if waiting < target else f"waiting {waiting} >= target {target}"


def running_limit(inputs: GateInputs, cls: PriorityClassConfig) -> int:
    """How many requests the engine may run for this class to add one (0: no limit): the tighter of
    `max_engine_running` and, while a better class is active, `max_engine_running_when_contended`."""
    limits = [cls.max_engine_running]
    if inputs.better_class_active:
        limits.append(cls.max_engine_running_when_contended)
    return min((limit for limit in limits if limit), default=0)


def check_running(inputs: GateInputs, cls: PriorityClassConfig, config: GateConfig) -> str | None:
    """Keep engine slots free, and its steps short, for better classes: this class only while fewer than
    its limit run."""
    limit = running_limit(inputs, cls)
    if not limit:
        return None
    running = inputs.estimated_running()
    if running < limit:
        return None
    contended = " (better class active)" if inputs.better_class_active and limit != cls.max_engine_running else ""
    return f"running {running} >= {limit} allowed for {cls.name}{contended}"


def check_tpot(inputs: GateInputs, cls: PriorityClassConfig, config: GateConfig) -> str | None:
    """The engine's time per output token over the last scrape interval must be under the class's limit."""
    tpot = inputs.reading.tpot_seconds if inputs.reading is not None else None
    if not cls.max_tpot_seconds or tpot is None or tpot <= cls.max_tpot_seconds:
        return None
    return f"tpot {tpot * 1000:.0f}ms > {cls.max_tpot_seconds * 1000:.0f}ms for {cls.name}"


def check_kv_cache(inputs: GateInputs, cls: PriorityClassConfig, config: GateConfig) -> str | None:
    """The engine's KV-cache usage must be under the class's limit (new work would cause preemptions)."""
    usage = inputs.reading.kv_cache_usage if inputs.reading is not None else None
    if not cls.max_kv_cache_usage or usage is None or usage <= cls.max_kv_cache_usage:
        return None
    return f"kv cache {usage:.0%} > {cls.max_kv_cache_usage:.0%} for {cls.name}"


class SignalGate:
    """Open when every configured signal check passes; the first failing check is the reason.

    With a stale reading, a failed scrape or none yet, no signal can be trusted: the backend then gets at
    most `fallback_max_in_flight` requests in flight, so a dead metrics endpoint degrades to a concurrency
    cap instead of a flood (blind dispatch) or a stall (wedged model).
    """

    checks: tuple[GateCheck, ...] = (check_waiting, check_running, check_tpot, check_kv_cache)

    def __init__(self, config: GateConfig) -> None:
        self._config = config

    def decide(self, inputs: GateInputs, priority_class: PriorityClassConfig) -> GateDecision:
        fallback = _fallback(inputs, self._config, priority_class)
        if fallback is not None:
            return fallback
        for check in self.checks:
            reason = check(inputs, priority_class, self._config)
            if reason is not None:
                return GateDecision(False, reason, True)
        return GateDecision(True, f"waiting {inputs.estimated_waiting()}: all signals under limits", True)


class QueueDepthGate(SignalGate):
    """Only the engine's waiting queue against the target (the v1 gate): TPOT and KV limits are ignored."""

    checks = (check_waiting,)


GateCheck = Callable[[GateInputs, PriorityClassConfig, GateConfig], "str | None"]

GATE_POLICIES: Registry[Gate] = Registry("gate")
GATE_POLICIES.register(
    "signals",
    SignalGate,
    "per-class waiting target, TPOT and KV-cache limits, idle-engine rule; concurrency cap when metrics are stale",
)
GATE_POLICIES.register(
    "queue_depth", QueueDepthGate, "engine waiting queue below a target only; concurrency cap when metrics are stale"
)

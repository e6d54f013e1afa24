"""Gates (saturation detectors): may one more request of a class go to this backend now?

A gate sees the backend's last `BackendLoad` reading and the scheduler's own bookkeeping of what it sent
since (`GateInputs`); it never talks to an engine. Each backend has its own gate instance, which is also
shown every reading (`observe`), so a gate may learn how its engine behaves (the TPOT signal learns the
engine's step time against its batch). The same gate serves every engine kind.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from backends.base import BackendLoad
from scheduler_svc.config import GateConfig, PriorityClassConfig, derived
from scheduler_svc.policies.registry import Registry
from scheduler_svc.policies.step_model import StepTimeModel
from scheduler_svc.policies.waiting_depth import WaitingDepth


@dataclass(slots=True)
class GateInputs:
    """Everything a gate may base its decision on (read-only for gates; not frozen: one is built for every
    gate question, and a frozen build of this many fields costs twice as much).

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
    waiting_bound: int | None = None  # most the engine can have waiting (in flight beyond its slots), if known
    better_tpot_limit: float = 0.0  # tightest TPOT limit of a better-ranked class active now (0: none)
    unstarted: int = 0  # ours in flight without a first token (waiting, in prefill, or on the way)
    unstarted_priorities: tuple[int, ...] = ()  # the engine priorities those carry, sorted (priority engines)
    candidate_priority: int | None = None  # the engine priority the request asked about would carry
    holding_work: bool = False  # the dispatcher asks for work it holds (introspection does not): gates may learn
    _waiting: int = field(default=-1, init=False, repr=False, compare=False)  # `estimated_waiting`, once worked out

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
        running = max(self._seen_running() + self.unseen_in_flight, self.started_in_flight + self.sent_unseen)
        return min(running, self.engine_slots) if self.engine_slots else running  # an engine runs no more

    def estimated_batch(self) -> int:
        """Requests the engine will run once it has admitted what it holds: the running estimate plus its
        waiting queue, at most its slot count when known (or what it runs, if a wrong slot count says less).
        This is the batch whose step time every running request will see, whichever client sent it (TPOT is
        engine-wide)."""
        seen_waiting = self.reading.waiting if self.reading is not None and self.reading.ok else 0
        running = self.estimated_running()
        batch = running + max(0, seen_waiting - self.started_since_reading)
        return min(batch, max(self.engine_slots, running)) if self.engine_slots else batch

    def estimated_waiting(self) -> int:
        """The engine's waiting queue now, as best we know: last reading corrected by what happened since.

        With the engine's slot count known and a reading that showed nothing waiting (the engine was
        admitting freely), requests that fit into its free slots are not counted as waiting. Worked out once
        (a decision reads it several times: each check, the load order, the gauges).
        """
        if self._waiting >= 0:
            return self._waiting
        seen = self.reading.waiting if self.reading is not None and self.reading.ok else 0
        waiting = max(0, seen - self.started_since_reading) + self.sent_unseen
        if self.engine_slots and seen == 0 and self.reading is not None:
            started_unseen = self.unseen_in_flight - self.sent_unseen
            running = max(self._seen_running() + started_unseen, self.started_in_flight)  # see estimated_running
            waiting = max(0, waiting - max(0, self.engine_slots - running))
        if self.engine_slots:
            # ours without a first token beyond the slots ours with one leave free are waiting, whatever a
            # reading says (a vLLM front end was seen reading 0 waiting through a whole queued flood)
            waiting = max(waiting, self.unstarted - max(0, self.engine_slots - self.started_in_flight))
        if self.waiting_bound is not None:
            waiting = min(waiting, self.waiting_bound)
        self._waiting = waiting
        return waiting

    def waiting_ahead(self) -> int:
        """Of the engine's waiting queue, the requests it would serve before the candidate.

        A priority engine (vLLM's priority policy) serves its queue by priority, lower first, ties in
        arrival order: a candidate sent with priority p queues behind ours waiting with a priority <= p, and
        behind everything else waiting (other clients' requests, ours sent without a priority), whose
        priority we do not know. Which of our unstarted requests are still waiting and which are already
        in prefill is unknown too; the ones ahead are assumed waiting, so this is never below the truth.
        Without a candidate priority (a FIFO engine), the whole queue is ahead.
        """
        waiting = self.estimated_waiting()
        if self.candidate_priority is None:
            return waiting
        ours_ahead = bisect_right(self.unstarted_priorities, self.candidate_priority)
        return min(waiting, ours_ahead + self.ahead_whatever_priority())

    def ahead_whatever_priority(self) -> int:
        """Of the engine's waiting queue at a priority engine, what it serves before any candidate whatever
        its priority: ours sent without a known priority and everything not ours (see `waiting_ahead`)."""
        ours_unknown = max(0, self.unstarted - len(self.unstarted_priorities))
        return ours_unknown + max(0, self.estimated_waiting() - self.unstarted)


class GateCause(StrEnum):
    """What a gate decision rests on, from a fixed set (a metric label: never free text). `reason` says the
    numbers; this says which signal: the one that closed the gate, or `open`."""

    OPEN = "open"
    STALE_METRICS = "stale_metrics"  # no fresh reading: the fallback in-flight cap is reached
    ENGINE_WAITING = "engine_waiting"  # the engine's queue (ahead of the request) is at the class's target
    ENGINE_RUNNING = "engine_running"  # the engine runs the class's limit (slots kept for better classes)
    TPOT = "tpot"  # one more request would push the predicted time per output token past the limit
    KV_CACHE = "kv_cache"  # the engine's KV-cache usage is over the class's limit
    COOLING_DOWN = "cooling_down"  # the backend failed a request and sits out its cooldown
    DRAINING = "draining"  # the backend is drained (maintenance, or removed from the configuration)
    OTHER = "other"  # a gate that does not say


@dataclass(slots=True)
class GateDecision:
    """The gate's answer with the reason (free text, for logs and introspection) and its cause (one of a fixed
    set, for metrics). Read-only once built (not frozen: one is built for every gate asked)."""

    open: bool
    reason: str
    fresh: bool
    cause: GateCause = GateCause.OTHER


class Gate(Protocol):
    """Decides whether a backend may take one more request of a class."""

    def observe(self, reading: BackendLoad) -> None:
        """Every scrape of the backend, good or failed, in order (a gate may learn from them)."""
        ...

    def decide(self, inputs: GateInputs, priority_class: PriorityClassConfig) -> GateDecision:
        """Open or closed, and why."""
        ...


class ReusableGate(Gate, Protocol):
    """A gate whose decisions dispatch may reuse while nothing they rest on changed, so a decision pass
    asks again only the gates of backends something happened to (`dispatch.openings`). It promises that
    `decide` answers the same for the same inputs (the clock aside) as long as `revision` is unchanged
    (`observe` changes it, and so does a `decide` that learned something that changes later answers), and
    that the clock changes the answer only at the time `expires` gives."""

    revision: int

    def expires(self, inputs: GateInputs, decision: GateDecision) -> float | None:
        """The clock time after which the same inputs may be decided otherwise (None: not before they
        change)."""
        ...


class PriorityBoundGate(Protocol):
    """A gate that can say, with one decision at a priority engine, how it would decide the same inputs for
    a candidate carrying a worse (higher) engine priority: open for a priority below the bound, closed at
    or above it. Dispatch then tells which users may go from their priorities alone (a user with requests in
    flight at an engine carries a worse priority there), instead of asking the gate for each."""

    def admits_below(self, inputs: GateInputs, decision: GateDecision, priority_class: PriorityClassConfig) -> float:
        """For candidates whose priority is at least `inputs.candidate_priority`: the bound (inf: all are
        admitted, -inf: none)."""
        ...


def _fallback(inputs: GateInputs, config: GateConfig, cls: PriorityClassConfig) -> GateDecision | None:
    """Without a fresh reading the gate cannot see the engine: allow a small number in flight only, and no
    more than the class's running limit (what we have in flight is then all we know the engine runs: a
    late scrape must not let batch work take the slots it leaves free for better classes)."""
    age = inputs.reading_age()
    if inputs.reading is not None and inputs.reading.ok and age is not None and age <= config.stale_after_seconds:
        return None
    cap = config.fallback_max_in_flight
    if inputs.waiting_bound is not None:  # a late scrape, slots known: fill them, keep the queue at the target
        cap = max(cap, inputs.engine_slots + config.waiting_target)
    if limit := running_limit(inputs, cls):
        cap = min(cap, limit)
    if inputs.in_flight < cap:
        return GateDecision(True, f"metrics stale: in flight {inputs.in_flight} < cap {cap}", False, GateCause.OPEN)
    return GateDecision(
        False, f"metrics stale: in flight {inputs.in_flight} >= cap {cap}", False, GateCause.STALE_METRICS
    )


GateCheck = Callable[[GateInputs, PriorityClassConfig, GateConfig], "str | None"]


def waiting_target(inputs: GateInputs, config: GateConfig) -> int:
    """The gate's waiting target for this candidate: at a priority engine `priority_waiting_target`,
    configured or derived from the engine's slots (`derived.priority_waiting_target`), else
    `waiting_target`."""
    if inputs.candidate_priority is not None:
        return derived.priority_waiting_target(config, inputs.engine_slots)
    return config.waiting_target


def check_waiting(
    inputs: GateInputs, cls: PriorityClassConfig, config: GateConfig, fifo_target: int | None = None
) -> str | None:
    """What the request would queue behind at the engine must stay below the class's target (batch: the
    engine queue must be empty).

    At a FIFO engine that is the whole waiting queue. At a priority engine it is only what the engine
    would serve first (`GateInputs.waiting_ahead`): a latecomer whose priority beats the flood's queued
    requests goes at once and takes the next free slot, as if it had marked itself urgent, instead of
    waiting in our queue for the engine's queue to drain below the target. The queue stays bounded: a
    request goes only while fewer than the target are ahead of it. There the target is the gate's
    `priority_waiting_target` when set: deeper, so that a front end that hands requests in late never
    leaves a slot empty, and harmless to whoever jumps the queue (derived from the engine's slots unless
    configured). At a FIFO engine `fifo_target`, when
    given, stands for `waiting_target` (the depth the gate learned, see `WaitingSignal`).
    """
    if cls.require_idle_engine:
        waiting = inputs.estimated_waiting()
        return None if waiting == 0 else f"waiting {waiting} > 0 and {cls.name} needs an idle engine queue"
    target = _class_waiting_target(inputs, cls, config, fifo_target)
    ahead = inputs.waiting_ahead()
    if ahead < target:
        return None
    if inputs.candidate_priority is None:
        return f"waiting {ahead} >= target {target}"
    return f"waiting ahead of priority {inputs.candidate_priority} {ahead} >= target {target}"


def _class_waiting_target(
    inputs: GateInputs, cls: PriorityClassConfig, config: GateConfig, fifo_target: int | None = None
) -> int:
    """The target `check_waiting` holds this candidate to: the class's own, else at a FIFO engine the learned
    `fifo_target` when given, else the gate's (`waiting_target`)."""
    if cls.waiting_target:
        return cls.waiting_target
    if inputs.candidate_priority is None and fifo_target is not None:
        return fifo_target
    return waiting_target(inputs, config)


def waiting_admits_below(inputs: GateInputs, cls: PriorityClassConfig, config: GateConfig) -> float:
    """At a priority engine, the engine priorities `check_waiting` admits for these inputs: a candidate
    whose priority is below the bound passes, one at or above it does not (inf: all pass, -inf: none).
    Only what the engine serves before the candidate depends on its priority (`waiting_ahead`): of ours
    waiting, those with a priority at most its own; so the check passes while fewer than the target less the
    rest ahead (ours of unknown priority, other clients') have a priority at most the candidate's."""
    waiting = inputs.estimated_waiting()
    if cls.require_idle_engine:
        return math.inf if waiting == 0 else -math.inf
    target = _class_waiting_target(inputs, cls, config)
    if waiting < target:
        return math.inf
    room = target - inputs.ahead_whatever_priority()  # ours with a priority at most the candidate's stay below it
    if room <= 0:
        return -math.inf
    if room > len(inputs.unstarted_priorities):
        return math.inf
    return float(inputs.unstarted_priorities[room - 1])


def running_limit(inputs: GateInputs, cls: PriorityClassConfig) -> int:
    """How many requests the engine may run for this class to add one (0: no limit): the tighter of
    `max_engine_running` and, while a better class is active, `max_engine_running_when_contended`."""
    limit = cls.max_engine_running
    contended = cls.max_engine_running_when_contended if inputs.better_class_active else 0
    if limit and contended:
        return min(limit, contended)
    return limit or contended


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


def tpot_limit(inputs: GateInputs, cls: PriorityClassConfig) -> float:
    """The TPOT a request of this class must not push the engine past (0: none): its own limit, or a
    better-ranked active class's when tighter, because every running request shares the engine's step."""
    own, better = cls.max_tpot_seconds, inputs.better_tpot_limit
    if own > 0 and better > 0:
        return min(own, better)
    return own if own > 0 else better if better > 0 else 0.0


class WaitingSignal:
    """The waiting check, with the depth it keeps at a FIFO engine learned from the engine's readings
    (`WaitingDepth`: as deep as the slots need, at most `waiting_target`). At a priority engine the
    learned depth is not used: there a latecomer jumps the queue, and `priority_waiting_target` holds."""

    def __init__(self, config: GateConfig) -> None:
        self.depth = WaitingDepth(config.waiting_target, config.waiting_target_adapt_seconds)

    def check(self, inputs: GateInputs, cls: PriorityClassConfig, config: GateConfig) -> str | None:
        return check_waiting(inputs, cls, config, fifo_target=self.depth.target)

    def learn(self, inputs: GateInputs, cls: PriorityClassConfig, decision: GateDecision) -> None:
        """Feed the depth one decision the dispatcher asked for with work in hand, where the model's FIFO
        target applies (no class target, no idle-engine rule, no engine priority)."""
        if not inputs.holding_work or inputs.candidate_priority is not None:
            return
        if cls.waiting_target or cls.require_idle_engine:
            return
        held_by_waiting = decision.cause in (GateCause.OPEN, GateCause.ENGINE_WAITING)
        self.depth.observe(inputs.reading, inputs.engine_slots, held_by_waiting)


class TpotSignal:
    """Admit one more request only while the engine's predicted TPOT with it stays under the limit.

    The prediction comes from a `StepTimeModel` learned from this backend's readings (see its module for
    why the last reading alone refills a drained engine past the limit). The batch it is asked about is
    `estimated_batch() + 1`: what the engine runs, plus its queue, plus everything we sent that no reading
    shows yet, plus this one. Before the first TPOT reading nothing can be predicted: as with stale metrics,
    at most `fallback_max_in_flight` requests go (an engine that reports TPOT only as requests end, or a
    test fake that never does, must not stall at one).

    A request that would run alone (the engine runs, queues and is sent nothing) always goes: its TPOT is
    the engine's best whatever the line says, nobody else's step gets slower, and an idle engine reports no
    TPOT, so a line above the limit at batch 1 (a slow engine, a slow spell) would otherwise never learn
    better and hold the class for good.
    """

    def __init__(self, half_life_seconds: float) -> None:
        self.model = StepTimeModel(half_life_seconds)

    def observe(self, reading: BackendLoad) -> None:
        self.model.observe(reading)

    def check(self, inputs: GateInputs, cls: PriorityClassConfig, config: GateConfig) -> str | None:
        limit = tpot_limit(inputs, cls)
        if not limit:
            return None
        if inputs.in_flight == 0 and inputs.estimated_batch() == 0:
            return None  # it would run alone (see the class docstring)
        batch = inputs.estimated_batch() + 1
        whose = cls.name if limit == cls.max_tpot_seconds else "a better class (active)"
        predicted = self.model.predict(batch)
        if predicted is None:
            cap = config.fallback_max_in_flight
            if inputs.in_flight < cap:
                return None
            return f"no tpot reading yet: in flight {inputs.in_flight} >= cap {cap} for {whose}"
        if predicted <= limit:
            return None
        return f"tpot at batch {batch} predicted {predicted * 1000:.0f}ms > {limit * 1000:.0f}ms for {whose}"


def check_kv_cache(inputs: GateInputs, cls: PriorityClassConfig, config: GateConfig) -> str | None:
    """The engine's KV-cache usage must be under the class's limit (new work would cause preemptions)."""
    usage = inputs.reading.kv_cache_usage if inputs.reading is not None else None
    if not cls.max_kv_cache_usage or usage is None or usage <= cls.max_kv_cache_usage:
        return None
    return f"kv cache {usage:.0%} > {cls.max_kv_cache_usage:.0%} for {cls.name}"


# class fields that are limits a gate may or may not act on (0 / false: not set)
CLASS_LIMITS = (
    "waiting_target",
    "require_idle_engine",
    "max_engine_running",
    "max_engine_running_when_contended",
    "max_tpot_seconds",
    "max_kv_cache_usage",
)


class SignalGate:
    """Open when every configured signal check passes; the first failing check is the reason.

    With a stale reading, a failed scrape or none yet, no signal can be trusted: the backend then gets at
    most `fallback_max_in_flight` requests in flight, so a dead metrics endpoint degrades to a concurrency
    cap instead of a flood (blind dispatch) or a stall (wedged model).
    """

    # the class fields this gate acts on; a class setting any other limit is a config error with it
    honours: frozenset[str] = frozenset(CLASS_LIMITS)

    def __init__(self, config: GateConfig) -> None:
        self._config = config
        self.tpot = TpotSignal(config.step_model_half_life_seconds)
        self.waiting = WaitingSignal(config)
        self.checks: tuple[tuple[GateCause, GateCheck], ...] = (
            (GateCause.ENGINE_WAITING, self.waiting.check),
            (GateCause.ENGINE_RUNNING, check_running),
            (GateCause.TPOT, self.tpot.check),
            (GateCause.KV_CACHE, check_kv_cache),
        )
        self.revision = 0  # `ReusableGate`: what the checks learned (the step line, the waiting depth)

    def observe(self, reading: BackendLoad) -> None:
        self.tpot.observe(reading)
        self.waiting.depth.scraped(reading)
        self.revision += 1

    def decide(self, inputs: GateInputs, priority_class: PriorityClassConfig) -> GateDecision:
        fallback = _fallback(inputs, self._config, priority_class)
        if fallback is not None:
            return fallback
        decision = self._decide_fresh(inputs, priority_class)
        depth = self.waiting.depth.target
        self.waiting.learn(inputs, priority_class, decision)
        if self.waiting.depth.target != depth:
            self.revision += 1
        return decision

    def expires(self, inputs: GateInputs, decision: GateDecision) -> float | None:
        """A decision on a fresh reading holds until the reading goes stale; one without holds until the
        inputs change (a new reading, a request sent or ended)."""
        if not decision.fresh or inputs.reading is None:
            return None
        return inputs.reading.read_at + self._config.stale_after_seconds

    def admits_below(self, inputs: GateInputs, decision: GateDecision, priority_class: PriorityClassConfig) -> float:
        """`PriorityBoundGate`: only the waiting check reads the candidate's priority, and a worse priority
        never lowers what queues ahead of it. So a closed gate stays closed for worse priorities; an open
        one, having passed every other check, admits what the waiting check admits; without a fresh
        reading no signal is read and the stale cap alone decides, for any priority."""
        if not decision.fresh:
            return math.inf if decision.open else -math.inf
        if not decision.open:
            return -math.inf
        return waiting_admits_below(inputs, priority_class, self._config)

    def _decide_fresh(self, inputs: GateInputs, priority_class: PriorityClassConfig) -> GateDecision:
        for cause, check in self.checks:
            reason = check(inputs, priority_class, self._config)
            if reason is not None:
                return GateDecision(False, reason, True, cause)
        return GateDecision(
            True, f"waiting {inputs.estimated_waiting()}: all signals under limits", True, GateCause.OPEN
        )


class QueueDepthGate(SignalGate):
    """`signals` with no class limits: only the engine's waiting queue against the target (the v1 gate).

    Kept as a name for old configs; a class that sets a limit this gate would ignore (TPOT, KV cache,
    running counts) is a config error, so a limit is never silently dropped.
    """

    honours = frozenset({"waiting_target", "require_idle_engine"})

    def __init__(self, config: GateConfig) -> None:
        super().__init__(config)
        self.checks = ((GateCause.ENGINE_WAITING, self.waiting.check),)


GATE_POLICIES: Registry[Gate] = Registry("gate")


def _register(name: str, gate: type[SignalGate], doc: str) -> None:
    GATE_POLICIES.register(name, gate, doc)


def ignored_limits(policy: str, cls: PriorityClassConfig) -> list[str]:
    """The limits `cls` sets that gate `policy` would not act on (config validation refuses them). A gate
    declares what it acts on in its `honours` class attribute; one that declares nothing honours no limit,
    so a limit is never accepted for a gate that silently ignores it. An unknown name ignores nothing here
    (the registry refuses the name itself)."""
    factory = GATE_POLICIES.factory(policy)
    if factory is None:
        return []
    honoured: frozenset[str] = getattr(factory, "honours", frozenset())
    return [name for name in CLASS_LIMITS if getattr(cls, name) and name not in honoured]


_register(
    "signals",
    SignalGate,
    "per-class waiting target, running limits, KV-cache limit, idle-engine rule, and a TPOT limit held by "
    "predicting the engine's step time at batch+1 from a line learned from its readings; concurrency cap "
    "when metrics are stale",
)
_register(
    "queue_depth",
    QueueDepthGate,
    "signals with no class limits: engine waiting queue below a target only (classes may not set TPOT, KV or "
    "running limits); concurrency cap when metrics are stale",
)

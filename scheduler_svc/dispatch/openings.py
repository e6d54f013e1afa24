"""Which backends' gates admit one more request now: engine priorities, drains, cooldowns, gate decisions.

For one model, `BackendGates` asks every backend's gate about a candidate (its class, the class whose gate
it goes under, its user) with inputs from the backend's load estimator; a backend that is draining, or
cooling down after a failover, is left out. The backend policy then picks among the open ones. The same
evaluation, for every class and a user with nothing at the engines, is what introspection shows (`states`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler_svc.config import PriorityClassConfig
from scheduler_svc.dispatch.activity import ClassActivity
from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.dispatch.gate_history import GateHistory
from scheduler_svc.dispatch.metrics import BackendSeries
from scheduler_svc.dispatch.steering import LOCAL, DispatchAuthority
from scheduler_svc.policies import GateCause, GateDecision, GateInputs


@dataclass(frozen=True, slots=True)
class Opening:
    """A backend whose gate admits the candidate now, with the inputs its gate saw."""

    handle: BackendHandle
    inputs: GateInputs

    @property
    def name(self) -> str:
        return self.handle.name


@dataclass(frozen=True)
class BackendState:
    """A backend's gate state for one class, for introspection."""

    name: str
    priority_class: str
    decision: GateDecision
    inputs: GateInputs


class EnginePriorities:
    """The engine priority a request carries to a priority engine (lower is served first): its class's
    `engine_priority`, worsened by `engine_priority_per_inflight` for each request its user already has
    at that engine, so a user's second and third requests queue behind other users' first ones."""

    def __init__(self, classes: Mapping[str, PriorityClassConfig], per_inflight: int) -> None:
        self._classes = classes
        self.per_inflight = per_inflight

    def of(self, priority_class: str, user: str | None, handle: BackendHandle) -> int | None:
        """For a request of this class and user (None: a user with nothing there); None when the backend
        takes no priorities."""
        if not handle.sends_priority:
            return None
        base = self._classes[priority_class].engine_priority
        in_flight = handle.estimator.user_in_flight.get(user, 0) if user is not None else 0
        return base + self.per_inflight * in_flight


def _left_out(handle: BackendHandle, now: float) -> GateCause | None:
    """Why the backend is not asked at all (it drains, or cools down after a failover); None: its gate decides."""
    if handle.draining:
        return GateCause.DRAINING
    if handle.cooling_for(now):
        return GateCause.COOLING_DOWN
    return None


class BackendGates:
    """Every backend's gate for one model."""

    def __init__(
        self,
        backends: Sequence[BackendHandle],
        activity: ClassActivity,
        priorities: EnginePriorities,
        series: Mapping[str, BackendSeries],
        history: GateHistory | None = None,
    ) -> None:
        self.backends = list(backends)
        self._activity = activity
        self.priorities = priorities
        self._series = series
        self._history = history  # with tracing on: each band-level change, for traced queue waits
        self._authority: DispatchAuthority = LOCAL  # its in-flight cap closes a backend like a gate would

    @property
    def authority(self) -> DispatchAuthority:
        """Who decides when requests go; its in-flight cap per backend closes a backend like a gate would."""
        return self._authority

    def steer(self, authority: DispatchAuthority) -> None:
        self._authority = authority

    def _capped(self, handle: BackendHandle) -> GateDecision | None:
        """A closed decision when the authority's in-flight cap is reached at `handle` (a replica gating
        alone while the cluster store is unreachable), else None."""
        cap = self._authority.in_flight_cap(handle)
        if cap is None or handle.estimator.in_flight < cap:
            return None
        return GateDecision(
            False, f"in flight {handle.estimator.in_flight} >= degraded cap {cap}", True, GateCause.OTHER
        )

    def open(
        self, gate_class: PriorityClassConfig, request_class: PriorityClassConfig, user: str | None, now: float
    ) -> list[Opening]:
        """The backends whose gate (for `gate_class`) admits one more request of `request_class` from `user`
        (None: a user with nothing at the engines, whose answer the gauges show), in config order. At a
        priority engine the answer depends on the user: its request queues behind only what the engine
        would serve first (see `check_waiting`)."""
        openings = []
        better_active = self._activity.better_active(gate_class, now)
        better_tpot = self._activity.better_tpot_limit(gate_class, now)
        for handle in self.backends:
            series = self._series[handle.name] if user is None else None  # the gauges show the band-level view
            left_out = _left_out(handle, now)
            if left_out is not None:
                if series is not None:
                    series.gate_open.set(0)
                    if causes := series.gate_causes.get(gate_class.name):
                        causes.show(left_out)
                    if self._history is not None:
                        self._history.saw(gate_class.name, handle.name, left_out, now)
                continue
            priority = self.priorities.of(request_class.name, user, handle)
            inputs = handle.estimator.gate_inputs(
                now, better_active, better_tpot_limit=better_tpot, candidate_priority=priority, holding_work=True
            )
            decision = self._capped(handle) or handle.gate.decide(inputs, gate_class)
            if series is not None:
                series.gate_open.set(1 if decision.open else 0)
                series.metrics_fresh.set(1 if decision.fresh else 0)
                series.estimated_waiting.set(inputs.estimated_waiting())
                cause = GateCause.OPEN if decision.open else decision.cause
                if causes := series.gate_causes.get(gate_class.name):
                    causes.show(cause)
                if self._history is not None:
                    self._history.saw(gate_class.name, handle.name, cause, now)
            if decision.open:
                openings.append(Opening(handle, inputs))
        return openings

    def states(self, classes: Sequence[PriorityClassConfig], now: float) -> list[BackendState]:
        """Every backend's gate decision for every class, with its inputs, for a request from a user with
        nothing at the engine (at a priority engine a user with requests there may find the gate closed)."""
        states = []
        for handle in self.backends:
            for cls in classes:
                inputs = handle.estimator.gate_inputs(
                    now,
                    self._activity.better_active(cls, now),
                    better_tpot_limit=self._activity.better_tpot_limit(cls, now),
                    candidate_priority=self.priorities.of(cls.name, None, handle),
                )
                decision = self._capped(handle) or handle.gate.decide(inputs, cls)
                if handle.draining:
                    why = ", ".join(sorted(handle.drains))
                    reason = f"draining ({why}): no new requests, running ones finish ({decision.reason})"
                    decision = GateDecision(False, reason, decision.fresh, GateCause.DRAINING)
                elif cooling := handle.cooling_for(now):
                    reason = f"cooling down {cooling:.1f}s after failing a request ({decision.reason})"
                    decision = GateDecision(False, reason, decision.fresh, GateCause.COOLING_DOWN)
                states.append(BackendState(handle.name, cls.name, decision, inputs))
        return states


class BackendChoice:
    """Which backends can take a request of one band now, per user, within one dispatch.

    At a priority engine whether a request may go depends on its engine priority (`EnginePriorities`), and
    only on that: users whose requests would carry the same priorities get the same answer, so each
    distinct answer is worked out once per dispatch, however many users the band holds.
    """

    def __init__(
        self, gates: BackendGates, gate_class: PriorityClassConfig, request_class: PriorityClassConfig, now: float
    ) -> None:
        self._gates = gates
        self._gate_class = gate_class
        self._request_class = request_class
        self._now = now
        self._answers: dict[tuple[int | None, ...], list[Opening]] = {}

    def for_user(self, user: str) -> list[Opening]:
        """The backends `user`'s next request may go to now (empty: no gate admits it)."""
        priorities = self._gates.priorities
        key = tuple(priorities.of(self._request_class.name, user, h) for h in self._gates.backends)
        if key not in self._answers:
            self._answers[key] = self._gates.open(self._gate_class, self._request_class, user, self._now)
        return self._answers[key]

    def eligible(self, user: str) -> bool:
        """Whether some backend can take `user`'s next request now (the fairness policy's filter)."""
        return bool(self.for_user(user))

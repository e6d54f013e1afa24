"""One dispatcher per model: picks the next request and sends it while a backend's gate is open.

The loop wakes on events only (a new request, an engine accepting or starting a request, a finished
request, a new metrics reading), never on a fixed tick. Each wake-up sends as many requests as the gates
allow: the best backlogged band first (strict by rank, with the anti-starvation guard), then the band's
fairness policy picks a user, then the ordering policy picks that user's request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from backends.errors import BackendError
from scheduler_svc.activity import ClassActivity
from scheduler_svc.backend_handle import BackendHandle
from scheduler_svc.capacity import Capacity
from scheduler_svc.clock import Clock
from scheduler_svc.config import ModelConfig, PriorityClassConfig, SchedulingConfig
from scheduler_svc.errors import InternalError, QueueTimeout, ShuttingDown
from scheduler_svc.failover import FailoverRule
from scheduler_svc.health import InternalErrors, LoopHealth, ServiceHealth
from scheduler_svc.metrics import SchedulerMetrics, backend_series, class_series
from scheduler_svc.policies import FAIRNESS_POLICIES, ORDERING_POLICIES, GateDecision, GateInputs
from scheduler_svc.policies.weights import WeightResolver
from scheduler_svc.positions import PositionNotifier
from scheduler_svc.queues import Band, Flow, ModelQueues
from scheduler_svc.rate import RateMeter
from scheduler_svc.request import QueuedRequest
from scheduler_svc.ticket import Outcome, Ticket

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class BackendState:
    """A backend's gate state for one class, for introspection."""

    name: str
    priority_class: str
    decision: GateDecision
    inputs: GateInputs


class ModelDispatcher:
    """Queues and dispatch for one model."""

    def __init__(
        self,
        model: ModelConfig,
        scheduling: SchedulingConfig,
        backends: Sequence[BackendHandle],
        clock: Clock,
        metrics: SchedulerMetrics,
        *,
        errors: InternalErrors | None = None,
        health: LoopHealth | None = None,
        on_done: Callable[[Ticket], None] | None = None,
    ) -> None:
        self.model = model
        self.clock = clock
        self.backends = list(backends)
        self._ordering = ORDERING_POLICIES.create(scheduling.ordering)
        self.queues = ModelQueues(scheduling.classes, self._ordering.key)
        self.classes = {c.name: c for c in scheduling.classes}
        weights = WeightResolver(scheduling.weights)
        self.fairness = {
            c.name: FAIRNESS_POLICIES.create(scheduling.fairness, weights, scheduling, clock)
            for c in scheduling.classes
        }
        self._priority_per_inflight = scheduling.engine_priority_per_inflight
        self._queued: dict[str, Ticket] = {}
        self._running: dict[str, Ticket] = {}
        self._metrics = metrics
        self._series = {h.name: backend_series(metrics, model.name, h.name) for h in self.backends}
        self._class_series = {c.name: class_series(metrics, model.name, c.name) for c in scheduling.classes}
        self.drain = RateMeter()
        self._promoted_last = False  # the last dispatch was an anti-starvation promotion
        self._activity = ClassActivity(scheduling.classes)
        self._wake = asyncio.Event()
        self._settled = asyncio.Event()  # set whenever a request reaches its outcome
        self.positions = PositionNotifier(self._queued)
        self.capacity = Capacity(model, self.queues)
        self._failover = FailoverRule(model)
        self.stopping = False  # set once the queue is closed on shutdown: no more dispatches nor failovers
        self.errors = errors or InternalErrors(lambda component: metrics.internal_errors.labels(component).inc())
        self.health = health or LoopHealth(
            f"dispatch:{model.name}", ServiceHealth(), max_failed_passes=3, max_stall_seconds=0.0
        )
        self._on_done = on_done
        self.dispatches = 0  # requests sent so far (the watchdog compares it between looks)
        self._dispatches_at_last_look = 0

    # -- admission and withdrawal ---------------------------------------------------------------------
    def enqueue(self, request: QueuedRequest) -> Ticket:
        """Queue an admitted request and return its ticket; QueueFull when a cap is reached."""
        self.capacity.check(request, self.busy, self.drain.rate(self.clock.now()))
        ticket = Ticket(request, self)
        self._put_in_queue(ticket)
        self.capacity.hold(request)
        self._class_series[request.priority_class].admitted.inc()
        self._activity.touch(request.priority_class, self.clock.now())
        self._set_depth(request.priority_class)
        self.wake()
        return ticket

    def _put_in_queue(self, ticket: Ticket, *, front: bool = False) -> Flow:
        """Queue the ticket's request (where the ordering puts it; at the head of its user's queue with
        `front`) and tell the band's fairness policy when the user just became backlogged. A request the
        ordering puts ahead of others moves them back one: their streaming clients are told."""
        request = ticket.request
        band = self.queues.band(request.priority_class)
        flow, newly_backlogged = self.queues.push(request, front=front)
        self._queued[request.request_id] = ticket
        if newly_backlogged:
            self.fairness[request.priority_class].on_backlogged(request.user, band.flow_views)
        elif not flow.is_last(request):
            self.positions.moved(flow)
        return flow

    def withdraw(self, ticket: Ticket) -> None:
        """Take a still-queued request out of the queue (dispatched, cancelled, expired, shutting down)."""
        flow = self.queues.flow_of(ticket.request.request_id)
        if self.queues.remove(ticket.request.request_id) is not None:
            del self._queued[ticket.request.request_id]
            self._set_depth(ticket.request.priority_class)
            if flow:  # the requests behind it moved up
                self.positions.moved(flow)

    def expire(self, ticket: Ticket) -> None:
        """End a queued request whose deadline passed; it is never dispatched."""
        self.withdraw(ticket)
        ticket.end_in_queue(Outcome.EXPIRED, QueueTimeout(f"request {ticket.request.request_id} expired in the queue"))

    def reject_all_queued(self, reason: str) -> int:
        """End every queued request with UNAVAILABLE (the service is stopping); returns how many. From
        here on a request an engine fails is not queued again either."""
        self.stopping = True
        tickets = list(self._queued.values())
        for ticket in tickets:
            self.withdraw(ticket)
            ticket.end_in_queue(Outcome.REJECTED, ShuttingDown(reason))
        return len(tickets)

    def cut_running(self, reason: str) -> int:
        """Cut every running generation (the shutdown grace is over); returns how many were cut."""
        return sum(ticket.cut(ShuttingDown(reason)) for ticket in list(self._running.values()))

    # -- events from running requests ---------------------------------------------------------------
    def on_first_token(self, ticket: Ticket) -> None:
        assert ticket.backend is not None and ticket.first_token_at is not None
        ticket.backend.estimator.started(ticket.request.request_id, ticket.first_token_at)
        self._class_series[ticket.request.priority_class].ttft.observe(
            ticket.first_token_at - ticket.request.admitted_at
        )
        self.wake()

    def on_generated(self, ticket: Ticket, tokens: int) -> None:
        self.fairness[ticket.request.priority_class].on_generated(ticket.request, tokens)
        assert ticket.backend is not None
        self._series[ticket.backend.name].generated_tokens.inc(tokens)

    def on_finished(self, ticket: Ticket) -> None:
        self._release(ticket)
        self.fairness[ticket.request.priority_class].on_finished(ticket.request, ticket.completion_tokens)
        self.wake()

    def _release(self, ticket: Ticket) -> None:
        """A dispatched request no longer holds its backend."""
        backend = ticket.backend
        assert backend is not None
        backend.estimator.finished(ticket.request.request_id, self.clock.now())
        if self._running.pop(ticket.request.request_id, None) is not None:
            self._activity.ended(ticket.request.priority_class, self.clock.now())
        self._series[backend.name].in_flight.set(backend.estimator.in_flight)

    def fail_over(self, ticket: Ticket, error: BackendError) -> bool:
        """The backend failed `ticket` before its first token: queue it again at the head of its user's
        queue and cool the backend down, so the next dispatch goes elsewhere. False when it should fail as
        it is: the error is not about the engine's availability, the request used its attempts or its
        deadline, or the service is stopping."""
        request = ticket.request
        now = self.clock.now()
        if self.stopping or not self._failover.may_retry(request, error, ticket.attempts, now):
            return False
        handle = ticket.backend
        assert handle is not None
        self._failover.cool_down(handle, now)
        self._release(ticket)
        ticket.requeued()  # first: from here a failure below leaves a ticket that close() can end cleanly
        self.fairness[request.priority_class].on_requeued(request)
        flow = self._put_in_queue(ticket, front=True)
        self._set_depth(request.priority_class)
        self.positions.moved(flow)  # the requests behind it moved down one
        self._series[handle.name].failovers.inc()
        log.warning(
            "request_failed_over",
            model=self.model.name,
            request_id=request.request_id,
            backend=handle.name,
            attempt=ticket.attempts,
            error=str(error),
        )
        self.wake()
        return True

    def on_outcome(self, ticket: Ticket) -> None:
        self.capacity.release(ticket.request)
        if self._on_done is not None:
            self._on_done(ticket)
        self._metrics.outcomes.labels(self.model.name, ticket.outcome.value if ticket.outcome else "?").inc()
        log.debug(
            "request_done",
            model=self.model.name,
            request_id=ticket.request.request_id,
            user=ticket.request.user,
            outcome=ticket.outcome.value if ticket.outcome else None,
            backend=ticket.backend.name if ticket.backend else None,
            tokens=ticket.completion_tokens,
        )
        self._settled.set()

    def on_reading(self) -> None:
        """A backend's metrics were read (or failed to be)."""
        self.wake()

    # -- queries ------------------------------------------------------------------------------------
    def position(self, ticket: Ticket) -> int:
        """1-based rank of the ticket's request in its user's queue by the ordering policy; 0 once it left."""
        flow = self.queues.flow_of(ticket.request.request_id)
        return flow.position(ticket.request) if flow is not None else 0

    def estimated_wait(self, ticket: Ticket) -> float | None:
        """Seconds until dispatch at the current drain rate, assuming each backlogged user of the band is
        served in turn and higher bands go first; None while the rate is unknown."""
        rate = self.drain.rate(self.clock.now())
        position = self.position(ticket)
        if rate <= 0 or position == 0:
            return None
        band = self.queues.band(ticket.request.priority_class)
        ahead_in_higher_bands = sum(
            b.size for b in self.queues.bands if b.priority_class.rank < band.priority_class.rank
        )
        ahead = ahead_in_higher_bands + position * max(1, len(band.flows)) - 1
        return ahead / rate

    @property
    def busy(self) -> int:
        """Requests queued or running."""
        return len(self._queued) + len(self._running)

    def backend_states(self) -> list[BackendState]:
        """Every backend's gate decision for every class, with its inputs, for a request from a user with
        nothing at the engine (at a priority engine a user with requests there may find the gate closed)."""
        now = self.clock.now()
        states = []
        for handle in self.backends:
            for cls in self.classes.values():
                inputs = handle.estimator.gate_inputs(
                    now,
                    self._activity.better_active(cls, now),
                    better_tpot_limit=self._activity.better_tpot_limit(cls, now),
                    candidate_priority=self._engine_priority(cls.name, None, handle),
                )
                decision = handle.gate.decide(inputs, cls)
                if cooling := handle.cooling_for(now):
                    reason = f"cooling down {cooling:.1f}s after failing a request ({decision.reason})"
                    decision = GateDecision(False, reason, decision.fresh)
                states.append(BackendState(handle.name, cls.name, decision, inputs))
        return states

    # -- the loop -------------------------------------------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Dispatch whenever something happened that may let a request go."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                self.dispatch_ready()
            except Exception as exc:  # a policy bug must not stop the model: count it, retry on the next event
                self.errors.report("dispatch", exc, model=self.model.name)
                self.health.pass_done(ok=False)

    def watchdog_look(self) -> None:
        """Tell the loop's health whether work that could go now has been waiting without any dispatch."""
        now = self.clock.now()
        moved = self.dispatches != self._dispatches_at_last_look
        self._dispatches_at_last_look = self.dispatches
        could = False
        if self.queues.size and not self.stopping:
            top = next(self.queues.backlogged_bands())
            could = self.open_backend(top.priority_class, top.priority_class, None, now) is not None
        self.health.observe(now, could_dispatch=could, dispatched_since_last=moved)

    async def wait_settled(self) -> None:
        """Wait until some request reaches its outcome (used to drain on shutdown)."""
        self._settled.clear()
        await self._settled.wait()

    def dispatch_ready(self) -> int:
        """Send every request the gates allow now; returns how many were sent.

        A band whose dispatch raises an unexpected error is left out for the rest of the pass, so the other
        bands keep going; the error is counted and the pass reported failed to the loop's health.
        """
        if self.stopping:
            return 0
        sent = 0
        now = self.clock.now()
        broken: set[str] = set()
        while self.queues.size:
            choice = self._choose_band(now, broken)
            if choice is None:
                break
            band, backends = choice
            try:
                went = self._dispatch_one(band, backends, now)
            except Exception as exc:
                broken.add(band.priority_class.name)
                self.errors.report("dispatch", exc, model=self.model.name, priority_class=band.priority_class.name)
                continue
            if went is None:
                break  # no backlogged user of the band may go now
            sent += went
        self.dispatches += sent
        self.health.pass_done(ok=not broken)
        return sent

    def _dispatch_one(self, band: Band, backends: BackendChoice, now: float) -> int | None:
        """Send the band's next request: fairness picks the user among those a backend can take now,
        ordering picks the request. Returns how many went (0: the user's queue held only expired requests),
        None when no backlogged user of the band may go."""
        fairness = self.fairness[band.priority_class.name]
        user = fairness.select(band.flow_views, backends.eligible)
        if user is None:
            return None
        handle = backends.for_user(user)
        assert handle is not None, "fairness chose a user no backend can take"
        ticket = self._next_live(band, user, now)
        if ticket is None:
            return 0  # the user's queue held only expired requests
        request = ticket.request
        self.withdraw(ticket)
        try:
            fairness.on_dispatched(request)
            priority = self._engine_priority(request.priority_class, request.user, handle)
        except Exception:
            # Out of the queue and not sent: end it now, or its client would wait for nothing.
            ticket.end_in_queue(Outcome.FAILED, InternalError("the scheduler failed to dispatch the request"))
            raise
        handle.estimator.dispatched(request.request_id, priority, request.user)
        ticket.assign(handle, now, priority)
        self._running[request.request_id] = ticket
        self._activity.started(request.priority_class, now)
        series = self._series[handle.name]
        series.dispatched.inc()
        series.in_flight.set(handle.estimator.in_flight)
        if ticket.attempts == 1:  # a failed-over request left the queue, and was observed, the first time
            self.drain.record(now)
            self._class_series[request.priority_class].queue_wait.observe(now - request.admitted_at)
        return 1

    def _next_live(self, band: Band, user: str, now: float) -> Ticket | None:
        """The user's next request by the ordering policy (the head of its flow), expiring dead ones on the
        way, so that expired requests never cost the user its turn."""
        while user in band.flows:
            request = band.flows[user].head()
            ticket = self._queued[request.request_id]
            if request.deadline is None or now < request.deadline:
                return ticket
            self.expire(ticket)
        return None

    def _choose_band(self, now: float, broken: set[str]) -> tuple[Band, BackendChoice] | None:
        """The band to serve and the gates its request must pass, or None when nothing may go now.

        Strict priority: the best backlogged band decides, and while its gate is closed (even for a user
        with nothing at the engine, the best placed at a priority engine) lower bands wait too (they would
        only slow it down). Anti-starvation: a lower band whose oldest request has waited longer than its
        `starvation_after_seconds` sends one request under the top band's gate, then the top band gets the
        next turn, so a starving band gets at most every other dispatch. The band's age is its oldest
        admission whatever the ordering policy (`Band.oldest_admission`); the request it sends is the one
        fairness and ordering choose.
        """
        backlogged = [b for b in self.queues.backlogged_bands() if b.priority_class.name not in broken]
        if not backlogged:
            return None
        top = backlogged[0]
        if self.open_backend(top.priority_class, top.priority_class, None, now) is None:
            return None
        if not self._promoted_last:
            for band in backlogged[1:]:
                limit = band.priority_class.starvation_after_seconds
                if limit and now - band.oldest_admission() > limit:
                    self._promoted_last = True
                    return band, BackendChoice(self, top.priority_class, band.priority_class, now)
        self._promoted_last = False
        return top, BackendChoice(self, top.priority_class, top.priority_class, now)

    def open_backend(
        self,
        gate_class: PriorityClassConfig,
        request_class: PriorityClassConfig,
        user: str | None,
        now: float,
    ) -> BackendHandle | None:
        """The least loaded backend whose gate (for `gate_class`) admits one more request of
        `request_class` from `user` (None: a user with nothing at the engines), if any; a backend cooling
        down after a failover gets none. At a priority engine the answer depends on the user: its request
        queues behind only what the engine would serve first (see `check_waiting`)."""
        best: tuple[int, int, int] | None = None
        chosen: BackendHandle | None = None
        better_active = self._activity.better_active(gate_class, now)
        better_tpot = self._activity.better_tpot_limit(gate_class, now)
        for handle in self.backends:
            series = self._series[handle.name] if user is None else None  # the gauges show the band-level view
            if handle.cooling_for(now):
                if series is not None:
                    series.gate_open.set(0)
                continue
            priority = self._engine_priority(request_class.name, user, handle)
            inputs = handle.estimator.gate_inputs(
                now, better_active, better_tpot_limit=better_tpot, candidate_priority=priority
            )
            decision = handle.gate.decide(inputs, gate_class)
            if series is not None:
                series.gate_open.set(1 if decision.open else 0)
                series.metrics_fresh.set(1 if decision.fresh else 0)
                series.estimated_waiting.set(inputs.estimated_waiting())
            if decision.open:
                key = (inputs.waiting_ahead(), inputs.estimated_waiting(), inputs.in_flight)
                if best is None or key < best:
                    best, chosen = key, handle
        return chosen

    def _engine_priority(self, priority_class: str, user: str | None, handle: BackendHandle) -> int | None:
        """The engine priority a request of this class and user would carry to `handle` (None: the backend
        takes none): class priority, worsened by the user's requests already at this engine (lower is
        served first), so a user's second and third requests queue behind other users' first ones."""
        if not handle.sends_priority:
            return None
        base = self.classes[priority_class].engine_priority
        in_flight = handle.estimator.user_in_flight.get(user, 0) if user is not None else 0
        return base + self._priority_per_inflight * in_flight

    def _set_depth(self, priority_class: str) -> None:
        self._class_series[priority_class].queue_depth.set(self.queues.band(priority_class).size)


class BackendChoice:
    """Which backend can take a request of one band now, per user, within one dispatch.

    At a priority engine whether a request may go depends on its engine priority, which depends on how
    many requests its user already has there; users with the same counts get the same answer, so each
    distinct answer is worked out once per dispatch, however many users the band holds.
    """

    def __init__(
        self,
        dispatcher: ModelDispatcher,
        gate_class: PriorityClassConfig,
        request_class: PriorityClassConfig,
        now: float,
    ) -> None:
        self._dispatcher = dispatcher
        self._gate_class = gate_class
        self._request_class = request_class
        self._now = now
        self._answers: dict[tuple[int, ...], BackendHandle | None] = {}

    def for_user(self, user: str) -> BackendHandle | None:
        """The backend `user`'s next request would go to now, None when no gate admits it."""
        backends = self._dispatcher.backends
        key = tuple(h.estimator.user_in_flight.get(user, 0) if h.sends_priority else 0 for h in backends)
        if key not in self._answers:
            dispatcher = self._dispatcher
            self._answers[key] = dispatcher.open_backend(self._gate_class, self._request_class, user, self._now)
        return self._answers[key]

    def eligible(self, user: str) -> bool:
        """Whether some backend can take `user`'s next request now (the fairness policy's filter)."""
        return self.for_user(user) is not None

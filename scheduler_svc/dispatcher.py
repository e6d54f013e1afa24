"""One dispatcher per model: picks the next request and sends it while a backend's gate is open.

The loop wakes on events only (a new request, an engine accepting or starting a request, a finished
request, a new metrics reading), never on a fixed tick. Each wake-up sends as many requests as the gates
allow: the band policy picks a band (strict by rank, with the anti-starvation guard), the band's fairness
policy a user among those some backend's gate admits, the ordering policy that user's request, and the
backend policy one of the open backends.

The dispatcher wires named parts, each in its own module: `capacity` (caps and retry hints), `openings`
(gate decisions, engine priorities, what introspection shows), `policies.band` and
`policies.backend_choice`, `failover` (may a failed request go again), `positions` (the notifier), and
one `load.LoadEstimator` per backend. The request itself runs in its caller's task (`request_run`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import structlog

from backends.errors import BackendError
from scheduler_svc.activity import ClassActivity
from scheduler_svc.backend_handle import BackendHandle
from scheduler_svc.capacity import Capacity, dispatch_eta
from scheduler_svc.clock import Clock
from scheduler_svc.config import ModelConfig, SchedulingConfig
from scheduler_svc.errors import InternalError, QueueTimeout, ShuttingDown
from scheduler_svc.failover import FailoverRule
from scheduler_svc.health import InternalErrors, LoopHealth, ServiceHealth
from scheduler_svc.hooks import DispatchAuthority, DispatchObserver
from scheduler_svc.metrics import RequestCounters, SchedulerMetrics, backend_series, class_series
from scheduler_svc.openings import BackendChoice, BackendGates, BackendState, EnginePriorities, Opening
from scheduler_svc.policies import FAIRNESS_POLICIES, ORDERING_POLICIES
from scheduler_svc.policies.backend_choice import BACKEND_POLICIES, Candidate
from scheduler_svc.policies.band import BAND_POLICIES
from scheduler_svc.policies.cost import CostAccounts, CounterScope, Prices
from scheduler_svc.policies.weights import WeightResolver
from scheduler_svc.positions import PositionNotifier
from scheduler_svc.queues import Band, Flow, ModelQueues
from scheduler_svc.rate import RateMeter
from scheduler_svc.request import QueuedRequest
from scheduler_svc.ticket import Outcome, Ticket

log = structlog.get_logger(__name__)

FREES_REFRESH_SECONDS = 0.25  # how long an estimate of when running requests end is reused


def _time_left(ticket: Ticket, now: float) -> float | None:
    """Expected seconds until a running request ends: the tokens it may still generate at its engine's last
    time per output token (else its own pace so far); None when neither is known."""
    assert ticket.backend is not None
    reading = ticket.backend.estimator.reading
    tpot = reading.tpot_seconds if reading is not None and reading.ok else None
    if not tpot and ticket.first_token_at is not None and ticket.completion_tokens > 1:
        tpot = (now - ticket.first_token_at) / (ticket.completion_tokens - 1)
    if not tpot:
        return None
    return max(0, ticket.request.max_tokens - ticket.completion_tokens) * tpot


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
        counter_scope: CounterScope | None = None,
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
        self.prices = Prices.of(model)
        scope = counter_scope or CounterScope(scheduling.fairness_scope)  # one per scheduler: shared by models
        for name, policy in self.fairness.items():
            policy.use_costing(self.prices, scope.counters(name, "user"), scope.counters(name, "group"))
        self._accounts = CostAccounts(scheduling.cost_accounts)
        self._queued: dict[str, Ticket] = {}
        self._running: dict[str, Ticket] = {}
        self._metrics = metrics
        self._series = {h.name: backend_series(metrics, model.name, h.name, self.classes) for h in self.backends}
        self._class_series = {c.name: class_series(metrics, model.name, c.name) for c in scheduling.classes}
        metrics.queued_demand.watch(model.name, self.queues.bands, clock)
        self._counters = RequestCounters(metrics, model.name, self._series, self._class_series, self._accounts.label)
        self.drain = RateMeter()
        self._activity = ClassActivity(scheduling.classes)
        self._bands = BAND_POLICIES.create(scheduling.band_policy)
        self._backend_policy = BACKEND_POLICIES.create(model.backend_policy, model.locality)
        self._deficit_bound = model.locality.deficit_bound
        self.gates = BackendGates(
            self.backends,
            self._activity,
            EnginePriorities(self.classes, scheduling.engine_priority_per_inflight),
            self._series,
        )
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
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
        self._frees_cache: dict[str, tuple[float, list[float] | None]] = {}  # class -> (when, `_frees`)
        self.dispatches = 0  # requests sent so far (the watchdog compares it between looks)
        self._dispatches_at_last_look = 0
        self.observer: DispatchObserver | None = None  # told of each request's events (a cluster follower)

    @property
    def authority(self) -> DispatchAuthority:
        """Who decides when requests go (`hooks.DispatchAuthority`; `LOCAL` by default)."""
        return self.gates.authority

    @authority.setter
    def authority(self, authority: DispatchAuthority) -> None:
        self.gates.authority = authority
        self.wake()

    # -- admission and withdrawal ---------------------------------------------------------------------
    def enqueue(self, request: QueuedRequest, *, force: bool = False) -> Ticket:
        """Queue an admitted request and return its ticket; QueueFull when a cap is reached (unless `force`:
        a request admitted before, registered again with a new cluster leader)."""
        if request.request_id in self._queued or request.request_id in self._running:
            # Server ids are unique: a second ticket for one would corrupt the queue (never a client's doing).
            raise InternalError(f"request {request.request_id} is already queued or running here")
        if not force:
            self.capacity.check(request, self.busy, self.dispatch_eta)
        ticket = Ticket(request, self)
        self._put_in_queue(ticket)
        self.capacity.hold(request)
        self._counters.admitted(request)
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

    def end_queued(self, request_id: str, outcome: Outcome, reason: Exception) -> bool:
        """End a still-queued request with `reason` (a cluster leader refused or ended it); False when it is
        not queued here."""
        ticket = self._queued.get(request_id)
        if ticket is None:
            return False
        self.withdraw(ticket)
        ticket.end_in_queue(outcome, reason)
        return True

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
    def on_accepted(self, ticket: Ticket) -> None:
        """The engine took the request (its response started)."""
        assert ticket.backend is not None
        now = ticket.accepted_at = self.clock.now()
        ticket.backend.estimator.accepted(ticket.request.request_id, now)
        if (accept := ticket.engine_accept) is not None:
            self._counters.accepted(ticket.request, ticket.backend.name, accept)
        if self.observer is not None:
            self.observer.on_accepted(ticket)

    def on_first_token(self, ticket: Ticket) -> None:
        assert ticket.backend is not None and ticket.first_token_at is not None
        self._counters.cost(ticket.request, self.prices.cost(ticket.request.prompt_tokens_estimate, 0))
        ticket.backend.estimator.started(ticket.request.request_id, ticket.first_token_at)
        self._counters.first_token(ticket.request, ticket.first_token_at - ticket.request.admitted_at)
        if self.observer is not None:
            self.observer.on_first_token(ticket)
        self.wake()

    def on_generated(self, ticket: Ticket, tokens: int) -> None:
        self.fairness[ticket.request.priority_class].on_generated(ticket.request, tokens)
        self._counters.cost(ticket.request, self.prices.cost(0, tokens))
        assert ticket.backend is not None
        self._counters.generated(ticket.request, ticket.backend.name, tokens)
        if self.observer is not None:
            self.observer.on_generated(ticket, tokens)

    def on_finished(self, ticket: Ticket, outcome: Outcome) -> None:
        """A dispatched request ended: its backend is free of it. Fairness charges what the engine did: a
        request that ended before any engine answered it (cancelled while chosen or being sent) is refunded."""
        self._release(ticket)
        reached = outcome is Outcome.COMPLETED or ticket.reached_engine
        self.fairness[ticket.request.priority_class].on_finished(
            ticket.request, ticket.completion_tokens, reached_engine=reached
        )
        self.wake()

    def on_aborted(self, ticket: Ticket) -> None:
        """The request's open engine request was closed before its end (its caller left, or it was cut)."""
        assert ticket.backend is not None
        self._counters.engine_aborted(ticket.request, ticket.backend.name, answered=ticket.accepted_at is not None)

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
        if self.stopping:
            return False
        # Not deciding here (a cluster follower): it waits in the queue and the leader decides retry or fail.
        if self.authority.dispatches_locally and not self._failover.may_retry(request, error, ticket.attempts, now):
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
        self._counters.failed_over(request, handle.name)
        log.warning(
            "request_failed_over",
            model=self.model.name,
            request_id=request.request_id,
            backend=handle.name,
            attempt=ticket.attempts,
            error=str(error),
        )
        if self.observer is not None:
            self.observer.on_failed_over(ticket, error)
        self.wake()
        return True

    def on_outcome(self, ticket: Ticket) -> None:
        self.capacity.release(ticket.request)
        if self._on_done is not None:
            self._on_done(ticket)
        if self.observer is not None:
            self.observer.on_outcome(ticket)
        self._counters.outcome(ticket.request, ticket.outcome.value if ticket.outcome else "?")
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
        if flow is None:
            return 0
        told = self.authority.position(ticket.request.request_id)  # a cluster follower: the leader's answer
        return told if told is not None else flow.position(ticket.request)

    def estimated_wait(self, ticket: Ticket) -> float | None:
        """Seconds until the queued ticket is dispatched, assuming each backlogged user of the band is served
        in turn and higher bands go first (`dispatch_eta` of the dispatches up to its own); None when the
        scheduler cannot estimate it (nothing dispatched lately and nothing running to end)."""
        position = self.position(ticket)
        if position == 0:
            return None
        band = self.queues.band(ticket.request.priority_class)
        ahead_in_higher_bands = sum(
            b.size for b in self.queues.bands if b.priority_class.rank < band.priority_class.rank
        )
        ahead = ahead_in_higher_bands + position * max(1, len(band.flows)) - 1
        return self.dispatch_eta(ahead + 1, ticket.request.priority_class)

    def dispatch_eta(self, needed: int, priority_class: str) -> float | None:
        """Seconds until `needed` more requests of the class's band can have left the queue: at the recent
        dispatch rate, and while no backend can take one now, as running requests end and make room (see
        `capacity.dispatch_eta`). None when neither is known."""
        now = self.clock.now()
        frees = self._frees(priority_class, now)
        return dispatch_eta(needed, self.drain.rate(now), frees)

    def _frees(self, priority_class: str, now: float) -> list[float] | None:
        """When no backend can take a request of the class now: each running request's expected seconds
        left (its remaining tokens at its engine's time per output token), ascending; None while one can.
        Worked out at most once per FREES_REFRESH_SECONDS per class (queue notices ask for every waiter)."""
        cached = self._frees_cache.get(priority_class)
        if cached is not None and 0 <= now - cached[0] < FREES_REFRESH_SECONDS:
            return cached[1]
        cls = self.classes[priority_class]
        frees: list[float] | None = None
        if not self.gates.open(cls, cls, "", now):  # "": a user with nothing running (no gauge updates)
            frees = sorted(t for t in (_time_left(ticket, now) for ticket in self._running.values()) if t is not None)
        self._frees_cache[priority_class] = (now, frees)
        return frees

    @property
    def busy(self) -> int:
        """Requests queued or running."""
        return len(self._queued) + len(self._running)

    def live_tickets(self) -> list[Ticket]:
        """Every queued or running ticket (what a cluster replica registers with a new leader)."""
        return [*self._queued.values(), *self._running.values()]

    def queued_ticket(self, request_id: str) -> Ticket | None:
        return self._queued.get(request_id)

    def running_ticket(self, request_id: str) -> Ticket | None:
        return self._running.get(request_id)

    def backend_states(self) -> list[BackendState]:
        """Every backend's gate decision for every class, with its inputs (see `BackendGates.states`)."""
        return self.gates.states(list(self.classes.values()), self.clock.now())

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
                self._wake_for_waiting_choice()
            except Exception as exc:  # a policy bug must not stop the model: count it, retry on the next event
                self.errors.report("dispatch", exc, model=self.model.name)
                self.health.pass_done(ok=False)

    def _wake_for_waiting_choice(self) -> None:
        """A fairness policy may wait briefly for a user about to return (`FairnessPolicy.wake_at`): wake
        the loop when that wait ends, so the choice is made again even if no other event comes."""
        due = [t for t in (f.wake_at() for f in self.fairness.values()) if t is not None]
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if due:
            delay = max(0.0, min(due) - self.clock.now())
            self._timer = asyncio.get_running_loop().call_later(delay, self.wake)

    def watchdog_look(self) -> None:
        """Tell the loop's health whether work that could go now has been waiting without any dispatch."""
        now = self.clock.now()
        moved = self.dispatches != self._dispatches_at_last_look
        self._dispatches_at_last_look = self.dispatches
        could = False
        if self.queues.size and not self.stopping and self.authority.dispatches_locally:
            top = next(self.queues.backlogged_bands())
            # Asked for a real user of the band: at a priority engine a newcomer may pass the gate while
            # every backlogged user's next request would queue too deep (a lone flood), which is no stall.
            choice = BackendChoice(self.gates, top.priority_class, top.priority_class, now)
            could = any(choice.eligible(user) for user in top.flows)
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
        if self.stopping or not self.authority.dispatches_locally:
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
        """Send the band's next request: fairness picks the user among those a backend can take now (with
        `locality.deficit_bound`, the users within that bound), ordering picks each one's request, the
        backend policy the request and one of the backends open to it. Returns how many went (0: the
        users' queues held only expired requests), None when no backlogged user may go."""
        fairness = self.fairness[band.priority_class.name]
        if self._deficit_bound > 0:
            users = fairness.offer(band.flow_views, backends.eligible, self._deficit_bound)
        else:
            user = fairness.select(band.flow_views, backends.eligible)
            users = [] if user is None else [user]
        if not users:
            return None
        candidates: list[Candidate[Opening]] = []
        for user in users:
            openings = backends.for_user(user)
            assert openings, "fairness chose a user no backend can take"
            live = self._next_live(band, user, now)
            if live is not None:
                candidates.append(Candidate(live.request, openings))
        if not candidates:
            return 0  # the users' queues held only expired requests
        in_flight = {h.name: h.estimator.in_flight for h in self.backends}
        request, opening = self._backend_policy.choose_among(candidates, in_flight)
        ticket = self._queued[request.request_id]
        handle = opening.handle
        self._send(ticket, handle, now, lambda: self.gates.priorities.of(request.priority_class, request.user, handle))
        return 1

    def grant(self, request_id: str, backend_name: str, engine_priority: int | None) -> bool:
        """Send a queued request to `backend_name` because the cluster's leader decided so, as `_dispatch_one`
        would have; False when the request is not queued here (gone, or the service is stopping)."""
        ticket = self._queued.get(request_id)
        handle = next((h for h in self.backends if h.name == backend_name), None)
        if ticket is None or handle is None or self.stopping:
            return False
        self._send(ticket, handle, self.clock.now(), lambda: engine_priority)
        self.dispatches += 1
        return True

    def adopt(
        self,
        ticket: Ticket,
        backend_name: str,
        engine_priority: int | None,
        attempt: int,
        *,
        accepted: bool,
        first_token: bool,
        tokens: int,
    ) -> bool:
        """Count a queued ticket as already running at `backend_name` (a cluster replica re-registered a
        request it runs with this new leader): withdrawn, assigned without being sent, its progress so far
        counted in the estimator and fairness. False when the backend is unknown."""
        handle = next((h for h in self.backends if h.name == backend_name), None)
        if handle is None or ticket.request.request_id not in self._queued:
            return False
        now = self.clock.now()
        self._send(ticket, handle, now, lambda: engine_priority)
        ticket.attempts = max(ticket.attempts, attempt)
        if accepted:
            handle.estimator.accepted(ticket.request.request_id, now)
        if first_token:
            ticket.first_token_at = now
            handle.estimator.started(ticket.request.request_id, now)
        if tokens:
            ticket.completion_tokens = tokens
            self.fairness[ticket.request.priority_class].on_generated(ticket.request, tokens)
        return True

    def _send(self, ticket: Ticket, handle: BackendHandle, now: float, priority_of: Callable[[], int | None]) -> None:
        """Take a queued ticket out of its queue and assign it to `handle`, with all the accounting."""
        request = ticket.request
        self.withdraw(ticket)
        try:
            self.fairness[request.priority_class].on_dispatched(request)
            priority = priority_of()
        except Exception:
            # Out of the queue and not sent: end it now, or its client would wait for nothing.
            ticket.end_in_queue(Outcome.FAILED, InternalError("the scheduler failed to dispatch the request"))
            raise
        handle.estimator.dispatched(request.request_id, priority, request.user)
        ticket.assign(handle, now, priority)
        self._backend_policy.on_dispatched(request, handle.name)
        self._running[request.request_id] = ticket
        self._activity.started(request.priority_class, now)
        self._series[handle.name].in_flight.set(handle.estimator.in_flight)
        first = ticket.attempts == 1  # a failed-over request left the queue, and was observed, the first time
        if first:
            self.drain.record(now)
        self._counters.dispatched(request, handle.name, now - request.admitted_at if first else None)

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
        """The band to serve and the gates its request must pass, or None when nothing may go now: the
        band policy decides among the backlogged bands that did not fail this pass."""
        backlogged = [b for b in self.queues.backlogged_bands() if b.priority_class.name not in broken]
        if not backlogged:
            return None
        turn = self._bands.choose(backlogged, now, lambda cls: bool(self.gates.open(cls, cls, None, now)))
        if turn is None:
            return None
        band = backlogged[turn.index]
        return band, BackendChoice(self.gates, turn.gate_class, band.priority_class, now)

    def _set_depth(self, priority_class: str) -> None:
        self._class_series[priority_class].queue_depth.set(self.queues.band(priority_class).size)

"""One model's dispatch, wired from named parts, each in its own module with one job:

    queue_book.QueueBook        what is queued, ticket by ticket, and whose position moved
    end_users.EndUserShares     each tenant's end users, served fairly inside its share (nested policies)
    run_ledger.RunLedger        what is in flight, per backend and class
    decisions.Decisions         one decision pass: band -> user -> request -> backend, while the gates allow
    handover.Handover           a queued request handed to a backend, with all that changes with it
    loop.DispatchLoop           wakes on events only and runs a pass; the timer for a held choice
    request_events.RequestEvents  what tickets and runs call back on: the accounting of each request's life,
                                and failover (the one interface a ticket knows)
    cluster_port.ClusterPort    the port a cluster steers the model through
    shutdown.Shutdown           stopping, and the steps of the drain
    live_config.LiveConfig      a reloaded configuration handed to the parts; backends drained and retired
    capacity, openings (gates and engine priorities), failover (the rule), health (the watchdog's look),
    introspection (the operator's snapshot)

`ModelDispatcher` only builds and connects them, and says which of them the rest of the service may use: the
scheduler queues a request (`enqueue`), runs the loop and drains through `shutdown`, and applies a reload
(`reconfigure`); a face runs a request with `events` as its host and asks `outlook` for what a waiting
client is told; the cluster steers through `cluster`; an operator reads `snapshot` and drains a backend
(`drain`). The request itself runs in its caller's task (`core.request_run`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scheduler_svc.config import ModelConfig, SchedulingConfig
from scheduler_svc.core.clock import Clock
from scheduler_svc.core.errors import InternalError, InvalidField
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.core.text import client_text
from scheduler_svc.core.ticket import Ticket
from scheduler_svc.core.tracing import GateLog, RequestTrace
from scheduler_svc.dispatch.activity import ClassActivity
from scheduler_svc.dispatch.backend_handle import BackendHandle, Drain
from scheduler_svc.dispatch.capacity import Capacity
from scheduler_svc.dispatch.cluster_port import ClusterPort
from scheduler_svc.dispatch.decisions import Decisions
from scheduler_svc.dispatch.drain_estimate import DrainEstimate
from scheduler_svc.dispatch.end_users import NESTED_PARAMS, EndUserShares
from scheduler_svc.dispatch.failover import FailoverRule
from scheduler_svc.dispatch.gate_history import GateHistory
from scheduler_svc.dispatch.handover import Handover
from scheduler_svc.dispatch.health import InternalErrors, LoopHealth, ServiceHealth, StallWatch
from scheduler_svc.dispatch.introspection import ModelSnapshot, backend_status, model_snapshot
from scheduler_svc.dispatch.live_config import LiveConfig
from scheduler_svc.dispatch.loop import DispatchLoop
from scheduler_svc.dispatch.metrics import RequestCounters, SchedulerMetrics, backend_series, class_series
from scheduler_svc.dispatch.openings import BackendGates, EnginePriorities
from scheduler_svc.dispatch.queue_book import QueueBook
from scheduler_svc.dispatch.request_events import RequestEvents
from scheduler_svc.dispatch.run_ledger import RunLedger
from scheduler_svc.dispatch.shutdown import Shutdown
from scheduler_svc.policies import FAIRNESS_POLICIES, ORDERING_POLICIES, Fairness
from scheduler_svc.policies.backend_choice import BACKEND_POLICIES, BackendPolicy
from scheduler_svc.policies.band import BAND_POLICIES
from scheduler_svc.policies.cost import CostAccounts, CounterScope, Prices
from scheduler_svc.policies.weights import WeightResolver


@dataclass(frozen=True, slots=True)
class Outlook:
    """What a client waiting in the queue is told besides its position: the model's queue depth, and about
    how long until its request goes (None while the drain rate is unknown)."""

    depth: int
    estimated_wait: float | None


class ModelDispatcher:
    """Queues and dispatch for one model (see the module docstring for its parts)."""

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
        trace_gates: bool = False,
    ) -> None:
        """`trace_gates`: keep the gates' recent changes for traced requests (`gate_history`)."""
        self.model = model
        self.clock = clock
        handles = tuple(backends)
        errors = errors or InternalErrors(lambda component: metrics.internal_errors.labels(component).inc())
        health = health or LoopHealth(
            f"dispatch:{model.name}", ServiceHealth(), max_failed_passes=3, max_stall_seconds=0.0
        )
        self._classes = list(scheduling.classes)
        classes = {c.name: c for c in self._classes}
        weights = WeightResolver(scheduling.weights)
        self._fairness: dict[str, Fairness] = {
            c.name: FAIRNESS_POLICIES.create(scheduling.fairness, weights, clock, params=scheduling.policy_params)
            for c in self._classes
        }
        prices = Prices.of(model)
        scope = counter_scope or CounterScope(scheduling.fairness_scope)  # one per scheduler: shared by models
        costing = {name: (scope.counters(name, "user"), scope.counters(name, "group")) for name in self._fairness}
        for name, policy in self._fairness.items():
            policy.account.use_costing(prices, *costing[name])
        series = {h.name: backend_series(metrics, model.name, h.name, classes) for h in handles}
        by_class = {c.name: class_series(metrics, model.name, c.name) for c in scheduling.classes}
        self._counters = RequestCounters(
            metrics, model.name, series, by_class, CostAccounts(scheduling.cost_accounts).label
        )
        self._activity = ClassActivity(scheduling.classes)
        nested_params = {**scheduling.policy_params, **NESTED_PARAMS}
        self._book = QueueBook(
            scheduling.classes,
            ORDERING_POLICIES.create(scheduling.ordering).key,
            lambda priority_class, size: by_class[priority_class].show_depth(size),
            EndUserShares(
                lambda: FAIRNESS_POLICIES.create(scheduling.fairness, WeightResolver(), clock, params=nested_params),
                prices,
            ),
        )
        metrics.queued_demand.watch(model.name, self._book.bands, clock)
        self._ledger = RunLedger(handles, self._activity, series)
        backend_policy: BackendPolicy = BACKEND_POLICIES.create(model.backend_policy, model.locality)
        history = GateHistory(scheduling.classes) if trace_gates else None
        self._gate_logs: dict[str, GateLog] | None = (
            None if history is None else {c.name: history.log(c.name) for c in scheduling.classes}
        )
        self._handover = Handover(
            self._book, self._ledger, self._fairness, backend_policy, self._counters, gate_logs=self._gate_logs
        )
        self._gates = BackendGates(
            handles,
            self._activity,
            EnginePriorities(classes, scheduling.engine_priority_per_inflight),
            series,
            history,
        )
        self._capacity = Capacity(model, self._book)
        self._drain = DrainEstimate(clock, self._ledger, self._gates, classes, self._handover.drain_rate)
        self._shutdown = Shutdown(self._book, self._ledger)
        self._stall_watch = StallWatch(health)
        self._failover = FailoverRule(model)

        def settled(ticket: Ticket) -> None:
            if on_done is not None:
                on_done(ticket)
            self._shutdown.settled()
            if self._live.retiring:
                self._live.retire_idle()

        self._events = RequestEvents(
            clock,
            self._book,
            self._ledger,
            self._fairness,
            prices,
            self._counters,
            self._capacity,
            self._failover,
            authority=lambda: self._gates.authority,
            stopping=lambda: self._shutdown.stopping,
            wake=self.wake,
            settled=settled,
            model=model.name,
            gate_logs=self._gate_logs,
        )
        self._decisions = Decisions(
            self._book,
            self._ledger,
            self._gates,
            self._fairness,
            BAND_POLICIES.create(scheduling.band_policy),
            backend_policy,
            model.locality.deficit_bound,
            model.locality.max_candidates,
            send=self._handover.send,
            expire=self._events.expire,
            may_dispatch=self._may_dispatch,
            errors=errors,
            health=health,
            model=model.name,
        )
        self._loop = DispatchLoop(self._decide, self._choose_again_at, clock, errors, health, model.name)
        self._live = LiveConfig(
            model,
            scheduling,
            clock,
            metrics,
            book=self._book,
            ledger=self._ledger,
            gates=self._gates,
            activity=self._activity,
            capacity=self._capacity,
            failover=self._failover,
            events=self._events,
            counters=self._counters,
            weights=weights,
            scope=scope,
            fairness=self._fairness,
            costing=costing,
            classes=self._classes,
            class_by_name=classes,
            by_class=by_class,
            series=series,
            wake=self.wake,
            history=history,
            gate_logs=self._gate_logs,
        )
        self._cluster = ClusterPort(
            clock,
            self._book,
            self._ledger,
            self._gates,
            self._events,
            self._fairness.__getitem__,
            send=self._handover.send,
            sent=self._stall_watch.count,
            stopping=lambda: self._shutdown.stopping,
            wake=self.wake,
        )

    # -- what the rest of the service uses --------------------------------------------------------------------
    @property
    def backends(self) -> Sequence[BackendHandle]:
        """The model's backends, in configuration order (the scheduler reads their metrics), then those that left
        the configuration and still drain."""
        return self._gates.backends

    @property
    def events(self) -> RequestEvents:
        """What the model's tickets and request runs call back on."""
        return self._events

    @property
    def cluster(self) -> ClusterPort:
        """The port a cluster agent steers this model through."""
        return self._cluster

    @property
    def shutdown(self) -> Shutdown:
        """Stopping the model: end what waits, wait for what runs, cut the rest (the scheduler's drain)."""
        return self._shutdown

    @property
    def loop(self) -> DispatchLoop:
        """The dispatch loop (the scheduler runs it; a driver on virtual time steps it)."""
        return self._loop

    def enqueue(self, request: QueuedRequest, *, force: bool = False, trace: RequestTrace | None = None) -> Ticket:
        """Queue an admitted request and return its ticket; QueueFull when a cap is reached (unless `force`:
        a request admitted before, registered again with a new cluster leader). `trace`: the call's trace,
        with tracing on; its queue wait starts now."""
        request_id = request.request_id
        if not self._book.has_band(request.priority_class):  # a mirror from a replica whose classes differ
            raise InvalidField("priority_class", f"class {client_text(request.priority_class)} is not served here")
        if self._book.ticket(request_id) is not None or self._ledger.ticket(request_id) is not None:
            # Server ids are unique: a second ticket for one would corrupt the queue (never a client's doing).
            raise InternalError(f"request {request_id} is already queued or running here")
        if not force:
            self._capacity.check(request, self.busy, self._drain.eta)
        ticket = Ticket(request, self._events)
        if trace is not None:
            ticket.trace = trace
            logs = self._gate_logs
            trace.queued(self.clock.now(), None if logs is None else logs[request.priority_class])
        _, newly_backlogged = self._book.put(ticket)
        if newly_backlogged:
            band = self._book.band(request.priority_class)
            self._fairness[request.priority_class].account.on_backlogged(request.user, band.flow_views)
        self._capacity.hold(request)
        self._counters.admitted(request)
        self._activity.touch(request.priority_class, self.clock.now())
        self.wake()
        return ticket

    def observe_sends(self, listener: Callable[[Ticket], None]) -> None:
        """Tell `listener` of every request handed to a backend, as it is (for a driver that runs the requests
        itself on a virtual clock: `app.stepped`)."""
        self._handover.observe(listener)

    def reload_problems(self, model: ModelConfig) -> list[str]:
        """Why `model`, the model's reloaded configuration, cannot be applied live (empty: it can); what
        `config.live` finds between two files is checked there."""
        return self._live.problems(model)

    def reconfigure(self, model: ModelConfig, scheduling: SchedulingConfig, added: Sequence[BackendHandle]) -> None:
        """Apply a reloaded configuration in place (`live_config`): nothing queued or running is dropped,
        reordered or admitted again, and the fairness counters stay; `added` are the new backends."""
        self.model = model
        self._live.apply(model, scheduling, added)

    def retire(self) -> None:
        """The model left the configuration and holds nothing any more: let go of what outlives the
        dispatcher otherwise (its bands' views of a class-wide spend)."""
        self._live.close_counters()

    @property
    def priority_classes(self) -> list[str]:
        """The classes the model serves: the configured ones, then those that left and still hold work."""
        return [c.name for c in self._classes]

    def backend(self, name: str) -> BackendHandle | None:
        """The backend called `name`, also one that left the configuration and still drains; None if none."""
        return self._live.backend(name)

    def drain(self, handle: BackendHandle, source: Drain, *, drain: bool = True) -> None:
        """Stop sending `handle` new requests for `source` (`drain=False`: `source` lets it take work again;
        it does once no source holds it). Its running requests finish; the queue goes to the other backends."""
        if drain:
            self._live.drain(handle, source)
        else:
            self._live.undrain(handle, source)

    @property
    def on_backend_gone(self) -> Callable[[BackendHandle], None]:
        """Called with a backend that left the configuration once nothing runs there any more."""
        return self._live.on_backend_gone

    @on_backend_gone.setter
    def on_backend_gone(self, callback: Callable[[BackendHandle], None]) -> None:
        self._live.on_backend_gone = callback

    def wake(self) -> None:
        """Something happened that may let a request go (a backend's new reading, say): pass again."""
        self._loop.wake()

    def decide(self) -> int:
        """One decision pass now: send every request the gates allow; returns how many went."""
        return self._decide()

    async def run(self) -> None:
        """The dispatch loop, until cancelled."""
        await self._loop.run()

    async def notify_positions(self, interval: float) -> None:
        """Tell streaming clients their new queue position when it changes, at most once per `interval`."""
        await self._book.notify_positions(interval)

    def outlook(self, ticket: Ticket) -> Outlook:
        """The model's queue depth and the ticket's estimated wait: each backlogged user of its band served in
        turn and better bands first, the requests ahead leaving as `drain_estimate` says (None when it cannot
        say: nothing dispatched lately and nothing running to end)."""
        position = self._events.position(ticket)
        wait = None
        if position:
            wait = self._drain.eta(self._book.ahead(ticket, position) + 1, ticket.request.priority_class)
        return Outlook(len(self._book), wait)

    @property
    def dispatches(self) -> int:
        """Requests sent so far, here or (leading a cluster) granted to other replicas."""
        return self._stall_watch.sent

    @property
    def busy(self) -> int:
        """Requests queued or running."""
        return len(self._book) + len(self._ledger)

    def snapshot(self, user: str, max_users: int) -> ModelSnapshot:
        """What an operator sees of the model (`dispatch.introspection`)."""
        now = self.clock.now()
        return model_snapshot(
            self.model.name,
            self._book,
            len(self._ledger),
            self._capacity.held_bytes,
            self._handover.drain_rate(now),
            self._fairness,
            self._gates.states(self._classes, now),
            user=user,
            max_users=max_users,
            backends=[backend_status(h) for h in self._gates.backends],
            retiring_classes=frozenset(self._live.retiring_classes),
        )

    def watchdog_look(self) -> None:
        """Tell the loop's health whether work that could go now has been waiting without any dispatch."""
        now = self.clock.now()
        self._stall_watch.look(now, self._decisions.could_dispatch(now))

    # -- wiring -----------------------------------------------------------------------------------------------
    def _may_dispatch(self) -> bool:
        return not self._shutdown.stopping and self._gates.authority.dispatches_locally

    def _decide(self) -> int:
        sent = self._decisions.dispatch_ready(self.clock.now())
        self._stall_watch.count(sent)
        return sent

    def _choose_again_at(self) -> float | None:
        """When the loop must pass again with no event: a fairness policy's held choice ends, or, while requests
        wait, a backend's failover cooldown ends (its gate may open by time alone)."""
        due = [t for t in (f.wake_at() for f in self._fairness.values()) if t is not None]
        cooled = self._gates.cooldown_end(self.clock.now())  # asked at every pass: drops the cooldowns over
        if cooled is not None and len(self._book):
            due.append(cooled)
        return min(due) if due else None

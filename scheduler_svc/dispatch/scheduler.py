"""The scheduler: admission into per-model queues, one dispatcher and one metrics monitor per backend.

scheduler.admit(request) -> Ticket      queue a validated request (both doors, through `dispatch.intake`)
scheduler.request_run(ticket)           the ticket's run, reporting to its model's dispatch
scheduler.outlook(ticket)               what a waiting client is told: the queue depth, its estimated wait
scheduler.snapshot(model, ...)          what an operator sees of a model (GetQueueState)
await scheduler.run()                   dispatch loops and metrics monitors, until cancelled
scheduler.reload_problems(config)       why a reloaded configuration cannot be applied live (none: it can)
scheduler.reconfigure(config)           apply it in place: models, classes, settings, backends added or drained
scheduler.drain_backend(model, name)    no new requests to a backend (an admin's maintenance), or undrain it
await scheduler.drain(grace)            on shutdown: stop admitting, let work finish, then reject

A model that leaves the configuration admits nothing from then on (admission reads the new configuration),
serves what it holds (on its backends, whatever drain the file had set: no later file could lift it), and goes
once nothing of it is queued or running: its loops stop and its adapters close.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import structlog

from backends.base import Backend, BackendSpec, HttpSettings
from backends.registry import create_backend
from scheduler_svc.config import BackendConfig, Config, ModelConfig
from scheduler_svc.core.clock import Clock, MonotonicClock
from scheduler_svc.core.errors import AlreadyExists, BackendNotFound, ModelNotFound, ShuttingDown
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.core.request_run import GenerationSource, RequestRun
from scheduler_svc.core.stream_pacing import NO_PACING, StreamPacing
from scheduler_svc.core.text import client_text
from scheduler_svc.core.ticket import Ticket
from scheduler_svc.core.tracing import RequestTrace, RequestTracer
from scheduler_svc.dispatch.backend_handle import BackendHandle, Drain
from scheduler_svc.dispatch.dispatcher import ModelDispatcher, Outlook
from scheduler_svc.dispatch.health import InternalErrors, LoopHealth, ServiceHealth
from scheduler_svc.dispatch.introspection import BackendStatus, ModelSnapshot, backend_status
from scheduler_svc.dispatch.load import LoadEstimator
from scheduler_svc.dispatch.metrics import SchedulerMetrics
from scheduler_svc.dispatch.monitor import BeatTimer, monitor, scrape_phases
from scheduler_svc.dispatch.steering import AdmissionGuard
from scheduler_svc.policies import GATE_POLICIES
from scheduler_svc.policies.cost import CounterScope

log = structlog.get_logger(__name__)

BackendFactory = Callable[[ModelConfig, BackendConfig], Backend]
CUT_REPORT_SECONDS = 1.0  # after cutting running requests, how long their RPCs get to report it


def default_backend_factory(model: ModelConfig, backend: BackendConfig) -> Backend:
    """Build the adapter for a configured engine."""
    http = HttpSettings(
        metrics_path=backend.metrics_path,
        metrics_timeout=model.gate.stale_after_seconds,
        connect_timeout=backend.connect_timeout_seconds,
        max_connections=backend.max_connections,
        idle_connection_seconds=backend.idle_connection_seconds,
    )
    spec = BackendSpec(
        name=backend.name,
        url=backend.url,
        engine_model=backend.engine_model or model.name,
        http=http,
        priority_scheduling=backend.priority_scheduling,
    )
    return create_backend(backend.kind, spec)


class Scheduler:
    """All models' queues and dispatchers."""

    def __init__(
        self,
        config: Config,
        *,
        backend_factory: BackendFactory = default_backend_factory,
        clock: Clock | None = None,
        metrics: SchedulerMetrics | None = None,
        spread_scrapes: bool = True,
        tracer: RequestTracer | None = None,
    ) -> None:
        """`spread_scrapes=False` reads every engine on the same beat (the bench's baseline). `tracer`: each
        admitted call's trace (`core.tracing`; None: tracing is off)."""
        self.config = config
        self.tracer = tracer
        self._spread_scrapes = spread_scrapes
        self.clock = clock or MonotonicClock()
        # how often every face's runs read a long answer from its engine
        self.pacing = StreamPacing(
            config.server.stream_read_interval_seconds,
            config.server.stream_read_after_tokens,
            config.server.stream_group_at_engine,
        )
        self.metrics = metrics or SchedulerMetrics()
        self.health = ServiceHealth()
        self.errors = InternalErrors(lambda component: self.metrics.internal_errors.labels(component).inc())
        self.dispatchers: dict[str, ModelDispatcher] = {}
        # (user, client request_id) -> its live ticket: a client's id is unique among its own live requests
        self._live_ids: dict[tuple[str, str], Ticket] = {}
        self._backend_factory = backend_factory
        self._counter_scope = CounterScope(config.scheduling.fairness_scope)  # global: shared by every model
        self._retiring: set[str] = set()  # models that left the configuration and still hold work
        self._tasks: asyncio.TaskGroup | None = None  # while `run` runs: the loops of models added later join it
        self._model_tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._monitors: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._beats = BeatTimer()  # one timer per beat of the engines read on it
        self._closing: set[asyncio.Task[None]] = set()  # adapters of backends that left, being closed
        for model in config.models:
            self.dispatchers[model.name] = self._build_dispatcher(model, config)
        self._accepting = True
        # Confirms each admission elsewhere before the call goes on (a cluster's leader); None: admitted here.
        self.guard: AdmissionGuard | None = None

    def _build_handle(self, model: ModelConfig, backend: BackendConfig) -> BackendHandle:
        return BackendHandle(
            config=backend,
            backend=self._backend_factory(model, backend),
            gate=GATE_POLICIES.create(model.gate.policy, model.gate),
            estimator=LoadEstimator(engine_slots=backend.max_num_seqs, learn_slots=backend.learn_max_num_seqs),
        )

    def _build_dispatcher(self, model: ModelConfig, config: Config) -> ModelDispatcher:
        server = config.server
        dispatcher = ModelDispatcher(
            model,
            config.scheduling,
            [self._build_handle(model, b) for b in model.backends],
            self.clock,
            self.metrics,
            counter_scope=self._counter_scope,
            errors=self.errors,
            health=LoopHealth(
                f"dispatch:{model.name}",
                self.health,
                max_failed_passes=server.unhealthy_after_failed_passes,
                max_stall_seconds=server.unhealthy_after_stalled_seconds,
            ),
            on_done=self._forget_id,
            trace_gates=self.tracer is not None,
        )
        dispatcher.on_backend_gone = lambda handle: self._backend_gone(model.name, handle)
        return dispatcher

    def admit(self, request: QueuedRequest, *, force: bool = False, trace: RequestTrace | None = None) -> Ticket:
        """Queue a validated request; raises ModelNotFound, AlreadyExists, QueueFull or ShuttingDown.

        `force` skips the caps and the duplicate-id rule: the request was admitted before and is registered
        again with a new cluster leader (it keeps its id when no live request holds it). `trace`: the call's
        trace (tracing on), kept on the ticket."""
        dispatcher = self.dispatchers.get(request.model)
        if dispatcher is None or request.model in self._retiring:
            served = sorted(self.dispatchers.keys() - self._retiring)
            raise ModelNotFound(f"unknown model {client_text(request.model)}; served models: {served}")
        if not self._accepting:
            raise ShuttingDown("the scheduler is shutting down; retry on another instance")
        key = (request.user, request.client_request_id)
        if request.client_request_id and key in self._live_ids and not force:
            raise AlreadyExists(
                f"request_id {request.client_request_id} is in use by another live request of user "
                f"{request.user}; use a new id, or wait for that request to end"
            )
        ticket = dispatcher.enqueue(request, force=force, trace=trace)
        if request.client_request_id:
            self._live_ids.setdefault(key, ticket)
        return ticket

    def request_run(
        self, ticket: Ticket, *, watch_positions: bool = False, generate: GenerationSource | None = None
    ) -> RequestRun:
        """The run of an admitted ticket, reporting to its model's dispatch. Its generation comes from the
        assigned backend's adapter, read at the service's pacing; or from `generate` (a cluster leader's
        mirror: the owner's reports, which are not an engine's stream and are not paced)."""
        host = self.dispatchers[ticket.request.model].events
        if generate is None:
            return RequestRun(ticket, host, watch_positions=watch_positions, pacing=self.pacing)
        return RequestRun(ticket, host, watch_positions=watch_positions, generate=generate, pacing=NO_PACING)

    def outlook(self, ticket: Ticket) -> Outlook:
        """What a client waiting in the queue is told besides its position."""
        return self.dispatchers[ticket.request.model].outlook(ticket)

    def models(self) -> list[str]:
        """The models' names, in configuration order (then those that left it and still hold work)."""
        return list(self.dispatchers)

    def snapshot(self, model: str, user: str, max_users: int) -> ModelSnapshot:
        """What an operator sees of `model` (a served one): queues per class and user, counters, gates."""
        snapshot = self.dispatchers[model].snapshot(user, max_users)
        return dataclasses.replace(snapshot, removed=True) if model in self._retiring else snapshot

    def _forget_id(self, ticket: Ticket) -> None:
        """A request reached its outcome: its client id may be used again (and a model that left the
        configuration may now be empty)."""
        request = ticket.request
        if request.client_request_id and self._live_ids.get((request.user, request.client_request_id)) is ticket:
            del self._live_ids[(request.user, request.client_request_id)]
        if request.model in self._retiring:  # looked at once the outcome is recorded, after this callback
            asyncio.get_running_loop().call_soon(self._retire_if_idle, request.model)

    # -- reload and drains ---------------------------------------------------------------------------------
    def reload_problems(self, config: Config) -> list[str]:
        """Why `config` cannot be applied live beyond what `config.live` finds between two files (empty: it
        can): a backend still draining after its removal cannot come back with another engine."""
        return [
            problem
            for model in config.models
            if (dispatcher := self.dispatchers.get(model.name)) is not None
            for problem in dispatcher.reload_problems(model)
        ]

    def reconfigure(self, config: Config) -> None:
        """Apply a checked configuration in place (see `live_config`). A new model starts with its loops; one
        that left admits nothing from now on and goes once it holds nothing; a kept model takes its new
        settings, classes and backends. Admission follows the new configuration from the next request."""
        configured = {model.name for model in config.models}
        for name in self.dispatchers.keys() - configured:
            self._retiring.add(name)
        for model in config.models:
            self._retiring.discard(model.name)
            dispatcher = self.dispatchers.get(model.name)
            now = asyncio.get_running_loop().time() if self._tasks is not None else 0.0  # new monitors read at once
            if dispatcher is None:
                dispatcher = self.dispatchers[model.name] = self._build_dispatcher(model, config)
                self._start_model(dispatcher, now)
                continue
            added = [self._build_handle(model, b) for b in model.backends if dispatcher.backend(b.name) is None]
            dispatcher.reconfigure(model, config.scheduling, added)
            for handle in added:
                self._start_monitor(dispatcher, handle, now)
        for name in sorted(self._retiring):
            dispatcher = self.dispatchers[name]
            dispatcher.reconfigure(_undrained(dispatcher.model), config.scheduling, [])
            self._retire_if_idle(name)
        self.config = config

    def drain_backend(self, model: str, backend: str, *, drain: bool = True) -> list[tuple[str, BackendStatus]]:
        """An admin's drain of backend `backend` of `model` (empty: of every model that has one): no new
        request goes there until it is undrained (`drain=False`), running ones finish, the queue goes to
        the other backends. Returns each backend's (model, status) after it; raises ModelNotFound or
        BackendNotFound."""
        if model and model not in self.dispatchers:
            raise ModelNotFound(f"unknown model {client_text(model)}; models: {self.models()}")
        changed = []
        for name in [model] if model else self.models():
            dispatcher = self.dispatchers[name]
            handle = dispatcher.backend(backend)
            if handle is not None:
                dispatcher.drain(handle, Drain.ADMIN, drain=drain)
                changed.append((name, backend_status(handle)))
        if not changed:
            where = f"model {client_text(model)}" if model else "any model"
            raise BackendNotFound(f"no backend {client_text(backend)} in {where}")
        return changed

    def _retire_if_idle(self, name: str) -> None:
        """A model that left the configuration goes once nothing of it is queued or running."""
        dispatcher = self.dispatchers.get(name)
        if dispatcher is None or name not in self._retiring or dispatcher.busy:
            return
        self._retiring.discard(name)
        del self.dispatchers[name]
        dispatcher.retire()
        for task in self._model_tasks.pop(name, []):
            task.cancel()
        for handle in list(dispatcher.backends):
            self._backend_gone(name, handle)
            self.metrics.forget_backend(name, handle.name, dispatcher.priority_classes)
        for priority_class in dispatcher.priority_classes:
            self.metrics.forget_class(name, priority_class, ())
        self.metrics.queued_demand.unwatch(name)
        self.health.set(f"dispatch:{name}", None)  # a loop that no longer runs says nothing of the service
        log.info("model_removed", model=name)

    def _backend_gone(self, model: str, handle: BackendHandle) -> None:
        """A backend that left the configuration runs nothing any more: stop reading it, close its adapter."""
        monitor = self._monitors.pop((model, handle.name), None)
        if monitor is not None:
            monitor.cancel()
        closing = asyncio.get_running_loop().create_task(handle.backend.aclose(), name=f"close:{model}:{handle.name}")
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        log.info("backend_removed", model=model, backend=handle.name)

    async def run(self) -> None:
        """Run every dispatcher and backend monitor until cancelled (those a reload adds join them)."""
        monitored = [(dispatcher, handle) for dispatcher in self.dispatchers.values() for handle in dispatcher.backends]
        intervals = [handle.config.scrape_interval_seconds for _, handle in monitored]
        phases = scrape_phases(intervals) if self._spread_scrapes else [0.0] * len(intervals)
        origin = asyncio.get_running_loop().time()  # one for all, so a beat's reads share one timer deadline
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                for dispatcher in self.dispatchers.values():
                    self._start_model(dispatcher)
                for (dispatcher, handle), phase in zip(monitored, phases, strict=True):
                    self._start_monitor(dispatcher, handle, origin + phase)
        finally:
            self._tasks = None

    def _start_model(self, dispatcher: ModelDispatcher, monitors_from: float | None = None) -> None:
        """Start the model's loops (while `run` runs), and with `monitors_from` its backends' monitors too."""
        if self._tasks is None:
            return
        name = dispatcher.model.name
        loops = [
            self._tasks.create_task(dispatcher.run(), name=f"dispatch:{name}"),
            self._tasks.create_task(
                dispatcher.notify_positions(self.config.server.queue_update_interval_seconds), name=f"positions:{name}"
            ),
        ]
        if self.config.server.unhealthy_after_stalled_seconds:
            loops.append(self._tasks.create_task(self._watchdog(dispatcher), name=f"watchdog:{name}"))
        self._model_tasks[name] = loops
        if monitors_from is not None:
            for handle in dispatcher.backends:
                self._start_monitor(dispatcher, handle, monitors_from)

    def _start_monitor(self, dispatcher: ModelDispatcher, handle: BackendHandle, first_beat: float) -> None:
        if self._tasks is None:
            return
        name = dispatcher.model.name
        self._monitors[(name, handle.name)] = self._tasks.create_task(
            monitor(dispatcher, handle, self.clock, self.metrics, self.errors, self._beats, first_beat),
            name=f"monitor:{name}:{handle.name}",
        )

    async def _watchdog(self, dispatcher: ModelDispatcher) -> None:
        """Look at the dispatcher a few times per stall limit: work ready and nothing sent means it is wedged."""
        period = min(1.0, self.config.server.unhealthy_after_stalled_seconds / 4)
        while True:
            await asyncio.sleep(period)  # a sampling period, not a synchronisation
            try:
                dispatcher.watchdog_look()
            except Exception as exc:
                self.errors.report("watchdog", exc, model=dispatcher.model.name)

    @property
    def accepting(self) -> bool:
        """False once draining: new requests are refused with ShuttingDown (readiness probes say so)."""
        return self._accepting

    def stop_admission(self) -> None:
        self._accepting = False

    async def drain(self, grace_seconds: float) -> None:
        """Stop admitting and dispatching; end what is queued at once with UNAVAILABLE (reason SHUTTING_DOWN)
        so its clients retry elsewhere; give running requests up to `grace_seconds`, then cut the rest,
        which end with the same status and reason."""
        self.stop_admission()
        dispatchers = list(self.dispatchers.values())  # a removed model may go while this waits
        for dispatcher in dispatchers:
            rejected = dispatcher.shutdown.reject_all_queued(
                "the scheduler is shutting down; retry on another instance"
            )
            if rejected:
                log.warning("drain_rejected_queued", model=dispatcher.model.name, count=rejected)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_seconds
        for dispatcher in dispatchers:
            while dispatcher.busy and (remaining := deadline - loop.time()) > 0:
                try:
                    await asyncio.wait_for(dispatcher.shutdown.wait_settled(), remaining)
                except TimeoutError:
                    break
        reason = "the scheduler shut down before the request finished; retry on another instance"
        cut = sum(dispatcher.shutdown.cut_running(reason) for dispatcher in dispatchers)
        if cut:
            log.warning("drain_cut_running", count=cut)
            for dispatcher in dispatchers:  # let each RPC send its status before gRPC stops
                while dispatcher.busy:
                    try:
                        await asyncio.wait_for(dispatcher.shutdown.wait_settled(), CUT_REPORT_SECONDS)
                    except TimeoutError:
                        break

    async def aclose(self) -> None:
        for dispatcher in list(self.dispatchers.values()):
            for handle in list(dispatcher.backends):
                await handle.backend.aclose()
        while self._closing:
            await asyncio.wait(set(self._closing))


def _undrained(model: ModelConfig) -> ModelConfig:
    """A model that left the configuration, its backends no longer drained by the file: no later file names
    them, so a drain the file set could never be lifted and what the model holds would wait for good (an
    admin's drain is the admin's to lift, and still holds)."""
    return dataclasses.replace(model, backends=[dataclasses.replace(b, drained=False) for b in model.backends])

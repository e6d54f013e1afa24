"""The scheduler: admission into per-model queues, one dispatcher and one metrics monitor per backend.

scheduler.admit(request) -> Ticket      the servicer's entry point
await scheduler.run()                   dispatch loops and metrics monitors, until cancelled
await scheduler.drain(grace)            on shutdown: stop admitting, let work finish, then reject
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

import structlog

from backends import Backend, HttpSettings, create_backend
from backends.base import BackendLoad
from scheduler_svc.clock import Clock, MonotonicClock
from scheduler_svc.config import BackendConfig, Config, ModelConfig
from scheduler_svc.dispatcher import BackendHandle, ModelDispatcher
from scheduler_svc.errors import ModelNotFound, ShuttingDown
from scheduler_svc.ledger import DispatchLedger
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.policies import GATE_POLICIES
from scheduler_svc.request import QueuedRequest
from scheduler_svc.text import client_text
from scheduler_svc.ticket import Ticket

log = structlog.get_logger(__name__)

BackendFactory = Callable[[ModelConfig, BackendConfig], Backend]


def default_backend_factory(model: ModelConfig, backend: BackendConfig) -> Backend:
    """Build the adapter for a configured engine."""
    return create_backend(
        kind=backend.kind,
        name=backend.name,
        url=backend.url,
        engine_model=backend.engine_model or model.name,
        priority_scheduling=backend.priority_scheduling,
        http=HttpSettings(
            metrics_path=backend.metrics_path,
            metrics_timeout=model.gate.stale_after_seconds,
            connect_timeout=backend.connect_timeout_seconds,
            max_connections=backend.max_connections,
        ),
    )


class Scheduler:
    """All models' queues and dispatchers."""

    def __init__(
        self,
        config: Config,
        *,
        backend_factory: BackendFactory = default_backend_factory,
        clock: Clock | None = None,
        metrics: SchedulerMetrics | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or MonotonicClock()
        self.metrics = metrics or SchedulerMetrics()
        self.dispatchers: dict[str, ModelDispatcher] = {}
        for model in config.models:
            handles = [
                BackendHandle(
                    config=b,
                    backend=backend_factory(model, b),
                    gate=GATE_POLICIES.create(model.gate.policy, model.gate),
                    ledger=DispatchLedger(engine_slots=b.max_num_seqs),
                )
                for b in model.backends
            ]
            self.dispatchers[model.name] = ModelDispatcher(model, config.scheduling, handles, self.clock, self.metrics)
        self._accepting = True

    @property
    def models(self) -> Mapping[str, ModelDispatcher]:
        return self.dispatchers

    def admit(self, request: QueuedRequest) -> Ticket:
        """Queue a validated request; raises ModelNotFound or ShuttingDown."""
        dispatcher = self.dispatchers.get(request.model)
        if dispatcher is None:  # first: a metric label below must name a configured model
            served = sorted(self.dispatchers)
            raise ModelNotFound(f"unknown model {client_text(request.model)}; served models: {served}")
        if not self._accepting:
            self.metrics.rejected.labels(dispatcher.model.name, "shutting_down").inc()
            raise ShuttingDown("the scheduler is shutting down; retry on another instance")
        return dispatcher.enqueue(request)

    async def run(self) -> None:
        """Run every dispatcher and backend monitor until cancelled."""
        async with asyncio.TaskGroup() as tasks:
            for dispatcher in self.dispatchers.values():
                tasks.create_task(dispatcher.run(), name=f"dispatch:{dispatcher.model.name}")
                tasks.create_task(
                    dispatcher.run_position_updates(self.config.server.queue_update_interval_seconds),
                    name=f"positions:{dispatcher.model.name}",
                )
                for handle in dispatcher.backends:
                    tasks.create_task(
                        _monitor(dispatcher, handle, self.metrics),
                        name=f"monitor:{dispatcher.model.name}:{handle.name}",
                    )

    def stop_admission(self) -> None:
        self._accepting = False

    async def drain(self, grace_seconds: float) -> None:
        """Stop admitting; wait up to `grace_seconds` for queued and running work; reject what is left queued."""
        self.stop_admission()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_seconds
        for dispatcher in self.dispatchers.values():
            while dispatcher.busy and (remaining := deadline - loop.time()) > 0:
                try:
                    await asyncio.wait_for(dispatcher.wait_settled(), remaining)
                except TimeoutError:
                    break
        for dispatcher in self.dispatchers.values():
            rejected = dispatcher.reject_all_queued("the scheduler is shutting down")
            if rejected:
                log.warning("drain_rejected_queued", model=dispatcher.model.name, count=rejected)

    async def aclose(self) -> None:
        for dispatcher in self.dispatchers.values():
            for handle in dispatcher.backends:
                await handle.backend.aclose()


async def _monitor(dispatcher: ModelDispatcher, handle: BackendHandle, metrics: SchedulerMetrics) -> None:
    """Read one backend's metrics every scrape interval and wake its dispatcher with each reading."""
    interval = handle.config.scrape_interval_seconds
    was_ok: bool | None = None
    while True:
        try:
            reading: BackendLoad = await handle.backend.load()
        except Exception as exc:  # an adapter bug must not stop the model: count it as a failed scrape
            log.exception("backend_load_failed", model=dispatcher.model.name, backend=handle.name)
            reading = BackendLoad(ok=False, read_at=time.monotonic(), error=f"{type(exc).__name__}: {exc}")
        handle.ledger.record_reading(reading)
        if not reading.ok:
            metrics.scrape_failures.labels(dispatcher.model.name, handle.name).inc()
        if reading.ok != was_ok:
            log.info(
                "backend_metrics",
                model=dispatcher.model.name,
                backend=handle.name,
                ok=reading.ok,
                error=reading.error,
            )
            was_ok = reading.ok
        dispatcher.on_reading()
        await asyncio.sleep(interval)  # the scrape period itself, not a synchronisation

"""Assemble and run the service: gRPC (scheduler, health, reflection), the OpenAI-compatible HTTP door,
the scheduler loops, /metrics. Both doors share one Scheduler on one event loop.

With `[cluster] store = "redis"` a `cluster.agent.ClusterAgent` makes this process one replica of several
(joined before serving; on shutdown it hands the lead over first, and leaves after the drain).

With a configuration file (`config_path`), SIGHUP and the admin call ReloadConfig read it again and apply
what may change live (`app.reload`).

Graceful shutdown, in this order: health flips to NOT_SERVING, admission stops (HTTP /readyz says 503),
queued and running work drains for `shutdown_grace_seconds`, what is still queued gets UNAVAILABLE (503 over
HTTP), then the gRPC server and the HTTP door stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import structlog
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from llmsched.v1 import scheduler_pb2 as pb
from llmsched.v1 import scheduler_pb2_grpc as pb_grpc
from scheduler_svc.app.reload import ConfigReloader
from scheduler_svc.app.tls import ServerTls
from scheduler_svc.cluster.agent import ClusterAgent
from scheduler_svc.cluster.store import ClusterStore
from scheduler_svc.config import ClusterConfig, Config
from scheduler_svc.core.auth import Authenticator
from scheduler_svc.core.clock import Clock, MonotonicClock
from scheduler_svc.core.errors import ConfigInvalid, SchedulerError
from scheduler_svc.dispatch.scheduler import BackendFactory, Scheduler, default_backend_factory
from scheduler_svc.grpc.decoding import DecodeGuard
from scheduler_svc.grpc.servicer import SchedulerServicer
from scheduler_svc.http import HttpDoor

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor

    from scheduler_svc.app.tracing import OtelTracer

log = structlog.get_logger(__name__)

RECEIVE_MARGIN_BYTES = 256 * 1024  # fields beside the prompt, and per-message framing (see _server_options)
PENDING_CALL_MARGIN = 3000  # calls beyond the queue caps that still reach admission (to be refused properly)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["SchedulerService"].full_name


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


StoreFactory = Callable[[ClusterConfig, CollectorRegistry], ClusterStore]
"""Builds the cluster store a replica meets the others on (`[cluster] store = "redis"`); tests pass a fake."""


def default_store_factory(cluster: ClusterConfig, registry: CollectorRegistry | None = None) -> ClusterStore:
    """The Redis store, its call timings and outages on the service's metrics `registry` (imported here: a
    process in memory mode never loads the Redis client)."""
    from scheduler_svc.cluster.redis_store import RedisStore

    return RedisStore.from_config(cluster, registry)


def replica_name(config: Config, grpc_port: int) -> str:
    """`[cluster] replica_name`, or the host name and the gRPC port (unique on one host)."""
    return config.cluster.replica_name or f"{socket.gethostname()}-{grpc_port}"


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("scheduler_loop_crashed", error=repr(task.exception()))


class SchedulerServer:
    """One running instance of the service."""

    def __init__(
        self,
        config: Config,
        *,
        backend_factory: BackendFactory = default_backend_factory,
        clock: Clock | None = None,
        store_factory: StoreFactory = default_store_factory,
        span_processor: SpanProcessor | None = None,
        config_path: str | Path | None = None,
    ) -> None:
        """`span_processor`: where spans go with `[tracing]` configured (tests: the SDK's in-memory exporter);
        None: batched to the OTLP exporter `[tracing]` names. `config_path`: the file `config` was read from,
        which a reload reads again (None: no reloads)."""
        clock = clock or MonotonicClock()
        self.tracer: OtelTracer | None = None
        if config.tracing.enabled:  # imported only then: without [tracing] the SDK is never loaded
            from scheduler_svc.app.tracing import OtelTracer

            self.tracer = OtelTracer(config.tracing, clock, span_processor)
        self.scheduler = Scheduler(config, backend_factory=backend_factory, clock=clock, tracer=self.tracer)
        self.authenticator = Authenticator(config.auth)  # both doors share it: a reload swaps its keys
        self.reloader: ConfigReloader | None = None
        if config_path is not None:
            self.reloader = ConfigReloader(
                config_path,
                self.scheduler,
                self.authenticator,
                self.scheduler.metrics.registry,
                clustered=config.cluster.store == "redis",
            )
        self._store_factory = store_factory
        self.agent: ClusterAgent | None = None  # set at start when [cluster] store = "redis"
        self._grpc = grpc.aio.server(interceptors=[DecodeGuard()], options=_server_options(config))
        self._tls = ServerTls.from_config(config.server)  # read once, at startup; shared by every listener
        self._health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        self._metrics_runner: web.AppRunner | None = None
        self._http_runner: web.AppRunner | None = None
        self._http_server: asyncio.Server | None = None
        self.http_door: HttpDoor | None = None  # set at start when server.http_listen is on
        self._scheduler_task: asyncio.Task[None] | None = None
        self._health_task: asyncio.Task[None] | None = None
        self.port = 0
        self.metrics_port = 0
        self.http_port = 0

    @property
    def config(self) -> Config:
        """The running configuration (a reload replaces it; what it cannot change is as at start)."""
        return self.scheduler.config

    @property
    def address(self) -> str:
        return f"{_split(self.config.server.listen)[0]}:{self.port}"

    @property
    def http_address(self) -> str:
        """host:port of the HTTP door (empty when it is off)."""
        return f"{_split(self.config.server.http_listen)[0]}:{self.http_port}" if self.http_port else ""

    async def start(self) -> None:
        """Bind the ports and start serving."""
        authenticator = self.authenticator
        reload = self.reloader.reload if self.reloader is not None else None
        pb_grpc.add_SchedulerServiceServicer_to_server(
            SchedulerServicer(self.scheduler, authenticator, reload), self._grpc
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._grpc)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self._grpc,
        )
        if self._tls is not None:
            self.port = self._grpc.add_secure_port(self.config.server.listen, grpc_credentials(self._tls))
        else:
            self.port = self._grpc.add_insecure_port(self.config.server.listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {self.config.server.listen}")
        if self.config.cluster.store == "redis":  # joined before serving: a duplicate name stops the start here
            store = self._store_factory(self.config.cluster, self.scheduler.metrics.registry)
            self.agent = ClusterAgent(self.scheduler, store, self.config.cluster, replica_name(self.config, self.port))
            await self.agent.start()
        self._scheduler_task = asyncio.create_task(self.scheduler.run(), name="scheduler")
        self._scheduler_task.add_done_callback(_report_crash)
        await self._grpc.start()
        if self.config.server.metrics_listen:
            await self._start_metrics()
        if self.config.server.http_listen:
            await self._start_http(authenticator)
        await self._set_health(serving=True)
        self._health_task = asyncio.create_task(self._follow_health(), name="health")
        log.info(
            "serving",
            grpc=self.address,
            http=self.http_address or None,
            metrics=f"{_split(self.config.server.metrics_listen)[0]}:{self.metrics_port}"
            if self.metrics_port
            else None,
            models=[m.name for m in self.config.models],
            tls="off" if self._tls is None else "mutual" if self._tls.mutual else "on",
            event_loop=type(asyncio.get_running_loop()).__module__.split(".")[0],
            tracing=f"{self.config.tracing.protocol} {self.config.tracing.endpoint}" if self.tracer else "off",
        )

    async def _start_metrics(self) -> None:
        registry = self.scheduler.metrics.registry

        async def metrics(_: web.Request) -> web.Response:
            response = web.Response(body=generate_latest(registry))
            response.headers["Content-Type"] = CONTENT_TYPE_LATEST
            return response

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        self._metrics_runner = web.AppRunner(app, access_log=None)
        self.metrics_port = await self._listen(self._metrics_runner, self.config.server.metrics_listen)

    async def _start_http(self, authenticator: Authenticator) -> None:
        """The HTTP door: its runner for the application's life, served through the door's own connection
        protocol (where its read bounds live) rather than a TCPSite."""
        door = self.http_door = HttpDoor(self.scheduler, authenticator)
        runner = self._http_runner = door.runner(shutdown_timeout=1.0)  # runs after the drain: little is left
        await runner.setup()
        host, port = _split(self.config.server.http_listen)
        ssl_context = self._tls.ssl_context() if self._tls is not None else None
        loop = asyncio.get_running_loop()
        self._http_server = await loop.create_server(lambda: door.connection(runner), host, port, ssl=ssl_context)
        self.http_port = int(self._http_server.sockets[0].getsockname()[1])

    async def _listen(self, runner: web.AppRunner, address: str) -> int:
        """Serve `runner` on `address` (with the shared TLS settings); the port bound."""
        await runner.setup()
        host, port = _split(address)
        ssl_context = self._tls.ssl_context() if self._tls is not None else None
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def _set_health(self, *, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self._health.set(name, status)

    async def _follow_health(self) -> None:
        """Mirror the core's health (wedged or failing dispatch loops) in grpc.health.v1."""
        health = self.scheduler.health
        while True:
            await health.changed.wait()
            health.changed.clear()
            await self._set_health(serving=health.serving)

    def reload(self, dry_run: bool = False, by: str = "SIGHUP") -> list[str]:
        """Read the configuration file again and apply it (`app.reload`); raises ConfigRefused (logged), the
        running configuration staying, or ConfigInvalid when the service has no file."""
        if self.reloader is None:
            raise ConfigInvalid("this service was not started from a configuration file: there is none to read")
        return self.reloader.reload(dry_run, by)

    def reload_on_signal(self) -> None:
        """SIGHUP: reload, with the outcome in the log only (a refusal is logged where it is decided)."""
        try:
            self.reload()
        except SchedulerError:
            pass
        except Exception:
            log.exception("config_reload_failed")

    async def wait_for_termination(self) -> None:
        await self._grpc.wait_for_termination()

    async def stop(self, grace: float | None = None) -> None:
        """Drain and stop; safe to call more than once."""
        grace = self.config.server.shutdown_grace_seconds if grace is None else grace
        await self._health.enter_graceful_shutdown()
        if self._health_task is not None:
            self._health_task.cancel()
            self._health_task = None
        if self.agent is not None:
            await self.agent.step_down()  # hand the lead over at once; follow the next leader while draining
        await self.scheduler.drain(grace)
        if self.agent is not None:
            await self.agent.aclose()
            self.agent = None
        await self._grpc.stop(grace=1.0)
        if self._http_server is not None:
            self._http_server.close()  # no new connections; the runner's cleanup closes the open ones
            self._http_server = None
        if self._http_runner is not None:
            await self._http_runner.cleanup()
            self._http_runner = None
        if self._scheduler_task is not None:
            self._scheduler_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scheduler_task
            self._scheduler_task = None
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
            self._metrics_runner = None
        await self.scheduler.aclose()
        if self.tracer is not None:  # the spans still held go out, for a bounded time (the SDK blocks)
            await asyncio.to_thread(self.tracer.close)
            self.tracer = None
        log.info("stopped")


def _server_options(config: Config) -> list[tuple[str, int]]:
    """gRPC core options sized from the queue caps and the prompt limits.

    The receive limit is the largest `max_prompt_bytes` plus room for the other fields and the framing of
    up to MAX_MESSAGES chat messages, so an oversized prompt reaches admission and gets its own answer
    (INVALID_ARGUMENT, PROMPT_TOO_LARGE, naming the limit) instead of gRPC's bare RESOURCE_EXHAUSTED.

    gRPC holds calls that arrived before the Python server picked them up, and past 1,000 of them
    (3,000 for certain) it drops new ones with a bare CANCELLED: no RetryInfo, no metric, no log. A burst
    of a few thousand Stream calls does that on two cores. Raising both limits to what the queues could
    hold lets every call reach admission, which answers over-cap calls with RESOURCE_EXHAUSTED itself.
    """
    capacity = sum(model.max_queued for model in config.models) + PENDING_CALL_MARGIN
    largest_prompt = max(model.max_prompt_bytes for model in config.models)
    return [
        ("grpc.server.max_pending_requests", capacity),
        ("grpc.server.max_pending_requests_hard_limit", capacity),
        ("grpc.max_receive_message_length", largest_prompt + RECEIVE_MARGIN_BYTES),
    ]


def grpc_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """Credentials for `grpc.aio.Server.add_secure_port` from the shared TLS material."""
    return grpc.ssl_server_credentials(
        [(tls.private_key, tls.cert_chain)],
        root_certificates=tls.client_ca,
        require_client_auth=tls.mutual,
    )

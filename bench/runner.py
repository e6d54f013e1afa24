"""One run of a scenario, and a scenario's runs in turn: an engine, optionally a scheduler in front of it, a
client, a probe, a workload.

A scenario is a handful of runs of the same workload that differ only in their `Mode` (straight to the
engine's FIFO or priority queue, or through llm-scheduler with some config, by its gRPC door or its
OpenAI-compatible HTTP door), so the modes' figures come from the same machine minutes apart and their
ratios cancel its speed. `run_modes` runs a workload once per mode, each in its own `open_run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import grpc

from bench import harness
from bench.clients import Client, DirectClient, HttpSchedulerClient, RoundRobinClient, RunClock, ScheduledClient
from bench.cluster import Cluster, Layout, cluster
from bench.configs import SCHEDULED_MODEL, NotAvailable, Toml, validated_toml, with_http_door
from bench.engines import Engine, EngineProvider
from bench.probe import EngineProbe
from bench.product import engine_pool
from bench.records import RequestRecord
from clients import pb_grpc

T = TypeVar("T")
ConfigBuilder = Callable[[Engine], Toml]


@dataclass(frozen=True)
class Mode:
    """How the clients reach the engine in one run."""

    label: str
    engine_policy: str = "fcfs"
    config: ConfigBuilder | None = None  # None: straight to the engine (or to the echo)
    echo: bool = False  # a bare gRPC echo (bench.grpc_echo) instead of the scheduler, engine unused
    http: bool = False  # the clients use the scheduler's OpenAI-compatible HTTP door instead of gRPC
    layout: Layout | None = None  # scheduler replicas (bench.cluster), each call to the next; None: one process

    @property
    def scheduled(self) -> bool:
        return self.config is not None

    def scheduler_toml(self, engine: Engine) -> str:
        """The scheduler's validated config for this mode (raises NotAvailable when the service refuses it)."""
        assert self.config is not None
        config = self.config(engine)
        return validated_toml(with_http_door(config) if self.http else config)

    def check_available(self) -> None:
        """Raise `NotAvailable` now if the scheduler would refuse this mode's config (or layout)."""
        if self.config is not None:
            engine = Engine("http://127.0.0.1:1", "probe", self.engine_policy)
            self.scheduler_toml(engine)
            if self.layout is not None:
                self.layout.check_available(self.config(engine))


@dataclass
class RunContext:
    """What a scenario's workload gets for one run."""

    mode: Mode
    engine: Engine
    client: Client
    probe: EngineProbe
    clock: RunClock
    scheduler: harness.SchedulerProc | None = None
    cluster: Cluster | None = None  # the replicas, in a run with a layout (`scheduler` is the first)
    records: list[RequestRecord] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def scheduler_cpu_seconds(self) -> float | None:
        """CPU seconds the scheduler process(es) used so far, every replica summed; None without one."""
        if self.cluster is not None:
            return sum(replica.cpu_seconds() for replica in self.cluster.replicas)
        return None if self.scheduler is None else self.scheduler.cpu_seconds()

    def send(
        self,
        user: str,
        tag: str,
        max_tokens: int,
        prompt: str,
        *,
        priority_class: str = "",
        engine_priority: int | None = None,
    ) -> RequestRecord:
        """Start one request in the background; its record fills in as it streams."""
        record = RequestRecord(user=user, tag=tag, sent=self.clock.now(), max_tokens=max_tokens)
        self.records.append(record)
        task = asyncio.create_task(
            self.client.run(record, prompt, priority_class=priority_class, engine_priority=engine_priority)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return record

    def closed_loop(
        self,
        user: str,
        tag: str,
        concurrency: int,
        max_tokens: int,
        prompt: str,
        stop: asyncio.Event,
        **kwargs: Any,
    ) -> None:
        """Keep `concurrency` requests of `user` outstanding until `stop` is set: a user always backlogged."""

        async def worker(i: int) -> None:
            text = f"{prompt} {i}"  # the worker's prompt, which also names its stream
            while not stop.is_set():
                record = RequestRecord(user=user, tag=tag, sent=self.clock.now(), max_tokens=max_tokens, stream=text)
                self.records.append(record)
                await self.client.run(record, text, **kwargs)
                if record.error is not None:
                    return  # a failing target would make this loop spin

        for i in range(concurrency):
            task = asyncio.create_task(worker(i))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def until(self, predicate: Callable[[], bool], timeout: float, poll: float = 0.05) -> bool:
        """Wait until `predicate()` holds (it reads records another task fills); False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(poll)  # records change in other tasks without an event to wait on
        return True

    async def wait_all(self, timeout: float) -> bool:
        """Wait for every request started so far; False if some are still running after `timeout`."""
        if not self._tasks:
            return True
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        return not pending

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def open_run(
    provider: EngineProvider, mode: Mode, *, scheduler_wrapper: Sequence[str] = ()
) -> AsyncIterator[RunContext]:
    """Start what `mode` needs, yield the run's context, and stop everything (requests first) afterwards."""
    # Idle connections closed before the engine's keep-alive (5 s) does, as the scheduler's adapters do:
    # the direct runs must not lose requests to that race either.
    timeout = aiohttp.ClientTimeout(total=None)
    async with (
        provider.engine(mode.engine_policy) as engine,
        aiohttp.ClientSession(connector=engine_pool(), timeout=timeout) as session,
    ):
        clock = RunClock()
        probe = EngineProbe(session, engine.url, clock)
        if mode.config is None and not mode.echo:
            context = RunContext(
                mode, engine, DirectClient(session, engine.url, engine.model, clock, mode.label), probe, clock
            )
            clock.reset()  # run time starts when the workload can start, not with the engine
            try:
                yield context
            finally:
                await probe.stop()
                await context.cancel_all()
            return
        async with contextlib.AsyncExitStack() as stack:
            replicas = await stack.enter_async_context(_servers(mode, engine, scheduler_wrapper))
            clients = []
            for replica in replicas.replicas:
                channel = await stack.enter_async_context(grpc.aio.insecure_channel(replica.target))
                clients.append(_client(replica, channel, mode, session, clock))
            client = clients[0] if mode.layout is None else RoundRobinClient(clients)
            context = RunContext(mode, engine, client, probe, clock, replicas.replicas[0])
            context.cluster = replicas if mode.layout is not None else None
            clock.reset()
            try:
                yield context
            finally:
                await probe.stop()
                await context.cancel_all()


@contextlib.asynccontextmanager
async def _servers(mode: Mode, engine: Engine, scheduler_wrapper: Sequence[str]) -> AsyncIterator[Cluster]:
    """What the clients of a mode talk to: the mode's replicas, one scheduler process, or the echo."""
    if mode.config is None:
        async with harness.grpc_echo() as echo:
            yield Cluster([echo])
    elif mode.layout is not None:
        config = mode.config(engine)
        async with cluster(with_http_door(config) if mode.http else config, mode.layout) as replicas:
            yield replicas
    else:
        async with harness.scheduler_process(mode.scheduler_toml(engine), scheduler_wrapper) as scheduler:
            yield Cluster([scheduler])


def _client(
    scheduler: harness.SchedulerProc,
    channel: grpc.aio.Channel,
    mode: Mode,
    session: aiohttp.ClientSession,
    clock: RunClock,
) -> Client:
    """The client of one scheduler process: its HTTP door or its gRPC door."""
    if mode.http:
        return HttpSchedulerClient(session, scheduler.http_url, SCHEDULED_MODEL, clock, mode.label)
    return ScheduledClient(pb_grpc.SchedulerServiceStub(channel), SCHEDULED_MODEL, clock, mode.label)


async def run_modes(
    provider: EngineProvider,
    modes: Sequence[Mode],
    body: Callable[[RunContext], Awaitable[T]],
    *,
    timeout: float,
    scheduler_wrapper: Sequence[str] = (),
) -> tuple[dict[str, T], dict[str, str]]:
    """Run `body` once per mode; returns (label -> result, label -> why it could not run)."""
    done: dict[str, T] = {}
    skipped: dict[str, str] = {}
    for mode in modes:
        try:
            mode.check_available()
        except NotAvailable as exc:
            skipped[mode.label] = str(exc)
            print(f"  {mode.label}: not available: {exc}", file=sys.stderr)
            continue
        started = time.monotonic()
        print(f"  {mode.label} ...", flush=True)
        try:
            async with open_run(provider, mode, scheduler_wrapper=scheduler_wrapper) as run:
                done[mode.label] = await _bounded(body(run), timeout)
        except TimeoutError:
            skipped[mode.label] = f"did not finish within {timeout:.0f}s"
        except (RuntimeError, OSError, NotAvailable) as exc:  # one failed run must not lose the others
            skipped[mode.label] = f"failed: {exc}"
            print(f"  {mode.label}: failed: {exc!r}", file=sys.stderr)
        print(f"  {mode.label}: {time.monotonic() - started:.1f}s", flush=True)
    return done, skipped


async def _bounded(awaitable: Awaitable[T], timeout: float) -> T:
    async with asyncio.timeout(timeout):
        return await awaitable

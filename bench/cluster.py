"""Scheduler replicas for the cluster scenarios: optionally a `redis-server`, and N `llmsched
serve` processes with the same config but their own gRPC and metrics ports and replica names.

Memory mode is N independent processes side by side (each gates the engine alone and computes fairness
alone). Redis mode (`[cluster] store = "redis"`) makes them one scheduler. A
checkout whose server does not wire the cluster agent yet would silently run redis mode as memory mode, so
a redis layout checks that every replica connected to Redis and wrote keys under its prefix before the
workload starts, and refuses clearly (not available) within seconds otherwise; later redis layouts of the
same bench process are then refused at once, without starting anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import grpc
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from bench import harness
from bench.configs import NotAvailable, Toml, validated_toml
from bench.product import MetricSamples
from clients import pb, pb_grpc
from engines import free_port

STORES = ("memory", "redis")
REDIS_SERVER = "redis-server"
WARMUP_USER = "bench-warmup"
_refused: list[str] = []  # why replicas of this checkout did not join Redis, once seen (one bench process)


@dataclass(frozen=True)
class Layout:
    """How many replicas front the engine, and where they meet ("memory": nowhere, each on its own)."""

    replicas: int = 1
    store: str = "memory"
    heartbeat_interval: float = 0.5
    heartbeat_timeout: float = 2.0
    settings: tuple[tuple[str, Any], ...] = ()  # more `[cluster]` keys for every replica (redis mode)

    def __post_init__(self) -> None:
        if self.store not in STORES or not 1 <= self.replicas <= 16:
            raise ValueError(f"bad layout: {self.replicas} replica(s), store {self.store!r}")

    @property
    def label(self) -> str:
        """e.g. "3 replicas, redis"."""
        return f"{self.replicas} replica{'s' if self.replicas > 1 else ''}, {self.store}"

    def replica_config(self, config: Toml, index: int, redis_url: str, key_prefix: str) -> Toml:
        """Replica `index`'s config: the shared one with its own metrics port and, in redis mode, the
        `[cluster]` section naming it (`{GRPC_PORT}` and `{METRICS_PORT}` are filled in at start)."""
        out = copy.deepcopy(config)
        out["server"] = {**out["server"], "metrics_listen": "127.0.0.1:{METRICS_PORT}"}
        if self.store == "redis":
            out["cluster"] = {
                "store": "redis",
                "redis_url": redis_url,
                "key_prefix": key_prefix,
                "replica_name": f"r{index + 1}",
                "heartbeat_interval_seconds": self.heartbeat_interval,
                "heartbeat_timeout_seconds": self.heartbeat_timeout,
                **dict(self.settings),
            }
        return out

    def check_available(self, config: Toml) -> None:
        """Raise `NotAvailable` now when the service refuses this layout's config or Redis is not installed."""
        if self.store == "redis" and shutil.which(REDIS_SERVER) is None:
            raise NotAvailable(f"{REDIS_SERVER} is not installed (Debian: apt-get install redis-server)")
        if self.store == "redis" and _refused:
            raise NotAvailable(f"not started: an earlier redis layout of this run was refused ({_refused[0]})")
        validated_toml(self.replica_config(config, 0, "redis://127.0.0.1:6379/0", "llmsched-bench"))


@dataclass(frozen=True)
class ClusterOptions:
    """`python -m bench` knobs for the cluster scenarios."""

    replicas: int = 3
    stores: tuple[str, ...] = STORES  # "memory": independent processes; "redis": one cluster
    scale: float = 1.0  # stretches every measuring window (and the floods that must outlast them)
    heartbeat_interval: float = 0.5
    heartbeat_timeout: float = 2.0

    def layout(self, replicas: int, store: str) -> Layout:
        return Layout(replicas, store, self.heartbeat_interval, self.heartbeat_timeout)

    def layouts(self, *, single_redis: bool = False) -> list[Layout]:
        """One process (the reference), then N in memory mode and N on Redis, as `stores`
        asks; `single_redis` adds one replica on Redis (S6's cost of the store alone)."""
        out = [self.layout(1, "memory")]
        if single_redis and "redis" in self.stores:
            out.append(self.layout(1, "redis"))
        out += [self.layout(self.replicas, store) for store in STORES if store in self.stores]
        return out


@dataclass
class Cluster:
    """The running replicas, in round-robin order, and the Redis they meet on (empty in memory mode)."""

    replicas: list[harness.SchedulerProc]
    redis_url: str = ""
    key_prefix: str = ""  # every Redis key of this cluster starts with it (redis mode)

    async def admitted(self) -> list[float | None]:
        """Requests each replica admitted so far (its own counter), None where its metrics did not answer."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            return list(await asyncio.gather(*(_admitted(session, r.metrics_url) for r in self.replicas)))


async def _admitted(session: aiohttp.ClientSession, metrics_url: str) -> float | None:
    try:
        async with session.get(metrics_url + "/metrics") as response:
            samples = MetricSamples.parse(await response.text())
    except (aiohttp.ClientError, TimeoutError):
        return None
    return samples.total("llmsched_requests_admitted_total") or 0.0


@contextlib.asynccontextmanager
async def redis_server() -> AsyncIterator[str]:
    """A private `redis-server` on a free port with its own data dir, nothing persisted; yields its URL."""
    if shutil.which(REDIS_SERVER) is None:
        raise NotAvailable(f"{REDIS_SERVER} is not installed (Debian: apt-get install redis-server)")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="llmsched-bench-redis-") as data_dir:
        args = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", data_dir]
        proc = harness.spawn([*args, "--save", "", "--appendonly", "no"], f"redis-{port}")
        url = f"redis://127.0.0.1:{port}/0"
        try:
            await _wait_redis(url, proc)
            yield url
        finally:
            proc.stop()


async def _wait_redis(url: str, proc: harness.Proc, timeout: float = 20.0) -> None:
    client = aioredis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"redis-server exited early; see {proc.log_path}")
            with contextlib.suppress(RedisError, OSError):
                if await client.ping():
                    return
            await asyncio.sleep(0.1)  # polling a child process for readiness: no event to wait on
    finally:
        await client.aclose()
    raise TimeoutError(f"redis-server at {url} not ready after {timeout}s; see {proc.log_path}")


@contextlib.asynccontextmanager
async def cluster(config: Toml, layout: Layout, *, ready_timeout: float = 30.0) -> AsyncIterator[Cluster]:
    """Start the layout's replicas for `config` (and their Redis), wait until each one serves a request, yield
    them; stop everything afterwards."""
    async with contextlib.AsyncExitStack() as stack:
        redis_url = await stack.enter_async_context(redis_server()) if layout.store == "redis" else ""
        key_prefix = f"llmsched-bench-{free_port()}"
        texts = [
            validated_toml(layout.replica_config(config, i, redis_url, key_prefix)) for i in range(layout.replicas)
        ]
        started = await asyncio.gather(
            *(stack.enter_async_context(harness.scheduler_process(text)) for text in texts),
            return_exceptions=True,
        )
        failed = [s for s in started if isinstance(s, BaseException)]
        if failed:
            raise failed[0]
        running = Cluster(cast("list[harness.SchedulerProc]", started), redis_url, key_prefix)
        if layout.store == "redis":
            await wait_joined(redis_url, key_prefix, running.replicas, max(10.0, 3 * layout.heartbeat_timeout))
        models = [str(m["name"]) for m in config["models"]]  # each model's leader decides once
        await asyncio.gather(*(_warm_up(r, m, ready_timeout) for r in running.replicas for m in models))
        yield running


async def wait_joined(
    redis_url: str, key_prefix: str, replicas: Sequence[harness.SchedulerProc], timeout: float
) -> None:
    """Wait until every replica holds a connection to Redis and some key names `key_prefix`; raise
    `NotAvailable` after `timeout` (a server that ignores `[cluster]` never does either)."""
    client = aioredis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout
    connected, keys = 0, 0
    try:
        while time.monotonic() < deadline:
            for replica in replicas:
                if replica.proc.popen.poll() is not None:
                    raise RuntimeError(f"replica at {replica.target} exited; see {replica.proc.log_path}")
            connected = len(await client.client_list()) - 1  # ourselves
            keys = len([k async for k in client.scan_iter(match=f"*{key_prefix}*", count=100)])
            if connected >= len(replicas) and keys:
                return
            await asyncio.sleep(0.1)  # polling another process's state in Redis: no event to wait on
    finally:
        await client.aclose()
    why = (
        f"the replicas did not join the cluster in Redis within {timeout:.0f} s ({connected} connection(s) for "
        f"{len(replicas)} replicas, {keys} key(s) under {key_prefix!r}): this checkout's server does not wire "
        '`[cluster] store = "redis"` (the scheduler_svc.cluster agent) yet, and its replicas would run as '
        "independent memory-mode processes"
    )
    if connected == 0 and not keys:  # none of them even tried: so will the next layout's
        _refused.append(why)
    raise NotAvailable(why)


async def _warm_up(replica: harness.SchedulerProc, model: str, timeout: float) -> None:
    """One short request through `replica`: it serves once this completes (in redis mode: a leader decides)."""
    params = pb.GenerationParams(model=model, prompt="warm-up", max_tokens=1, ignore_eos=True)
    async with grpc.aio.insecure_channel(replica.target) as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)
        try:
            request = pb.SubmitRequest(params=params)
            await stub.Submit(request, metadata=(("x-user-id", WARMUP_USER),), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise RuntimeError(
                f"replica at {replica.target}: warm-up request failed: {exc.code().name}: {exc.details()}; "
                f"see {replica.proc.log_path}"
            ) from None

"""Several scheduler replicas in one event loop: real gRPC servers on port 0, each with its own Scheduler and
cluster agent, all meeting on one in-memory `FakeStoreBackend` (the store is faked; everything else is
real: gRPC clients, the simulator over HTTP)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

from scheduler_svc.app.server import SchedulerServer, StoreFactory
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.cluster.agent import ClusterAgent
from scheduler_svc.cluster.leases import fair_share
from scheduler_svc.cluster.modes import Role
from scheduler_svc.cluster.store import ClusterStore
from scheduler_svc.config import Config
from tests.cluster.fake_store import FakeStore, FakeStoreBackend
from tests.helpers import eventually

HEARTBEAT = 0.1
TIMEOUT = 0.4


def cluster_config(
    backend_url: str,
    name: str,
    *,
    gate: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    cluster: dict[str, Any] | None = None,
    scheduling: dict[str, Any] | None = None,
    backends: list[dict[str, Any]] | None = None,
    models: tuple[str, ...] = ("m",),
) -> Config:
    """One replica's config: each of `models` ("m" alone by default) on one simulator backend "b0", fast
    heartbeats."""
    return config_from_dict(
        {
            "server": {
                "listen": "127.0.0.1:0",
                "metrics_listen": "",
                "queue_update_interval_seconds": 0.05,
                "shutdown_grace_seconds": 1.0,
            },
            "models": [
                {
                    "name": name,
                    "default_max_tokens": 16,
                    "gate": gate or {},
                    **(model or {}),
                    "backends": backends
                    or [
                        {
                            "name": "b0",
                            "kind": "vllm",
                            "url": backend_url,
                            "engine_model": "sim-model",
                            "scrape_interval_seconds": 0.05,
                        }
                    ],
                }
                for name in models
            ],
            **({"scheduling": scheduling} if scheduling else {}),
            "cluster": {
                "store": "redis",
                "replica_name": name,
                "heartbeat_interval_seconds": HEARTBEAT,
                "heartbeat_timeout_seconds": TIMEOUT,
                "admission_wait_seconds": 1.0,
                "report_interval_seconds": 0.02,
                **(cluster or {}),
            },
        }
    )


def serving(store: ClusterStore) -> StoreFactory:
    """A store factory that hands the replica `store` (a handle made beforehand, to fault or watch)."""
    return lambda _config, _registry: store


def agent_of(server: SchedulerServer) -> ClusterAgent:
    assert server.agent is not None
    return server.agent


async def start_replica(store: FakeStoreBackend, config: Config) -> SchedulerServer:
    server = SchedulerServer(config, store_factory=serving(FakeStore(store)))
    await server.start()
    return server


@contextlib.asynccontextmanager
async def replicas(
    backend_url: str, count: int = 3, store: FakeStoreBackend | None = None, **kwargs: Any
) -> AsyncIterator[tuple[FakeStoreBackend, list[SchedulerServer]]]:
    """`count` replicas r0..r{n-1}; r0 starts first and leads once the others follow it."""
    store = store or FakeStoreBackend()
    servers: list[SchedulerServer] = []
    try:
        for i in range(count):
            servers.append(await start_replica(store, cluster_config(backend_url, f"r{i}", **kwargs)))
            if i == 0:
                await eventually(lambda: agent_of(servers[0]).role is Role.LEADING, 5.0, "r0 leading")
        await settled(servers)
        yield store, servers
    finally:
        await stop_all(servers)


async def stop_all(servers: Iterable[SchedulerServer], grace: float = 0.5) -> None:
    """Stop every replica still running, whatever state a failed test left it in."""
    for server in servers:
        with contextlib.suppress(Exception):
            await server.stop(grace=grace)


async def settled(servers: list[SchedulerServer], timeout: float = 5.0) -> SchedulerServer:
    """Wait until exactly one replica leads and every other follows it; returns the leader."""

    def ok() -> bool:
        agents = [agent_of(s) for s in servers]
        leaders = [a for a in agents if a.role is Role.LEADING]
        return len(leaders) == 1 and all(
            a.role is Role.FOLLOWING and a.follower.leader_of("m") == leaders[0].holder_of("m")
            for a in agents
            if a is not leaders[0]
        )

    await eventually(ok, timeout, "one leader, the others following it")
    return next(s for s in servers if agent_of(s).role is Role.LEADING)


async def leaders_settled(
    servers: list[SchedulerServer], models: tuple[str, ...], timeout: float = 15.0
) -> dict[str, SchedulerServer]:
    """Wait until each model has exactly one leader, every other replica follows that leader for it, and no
    replica holds more than its share of the leases (`leases.fair_share`); returns model -> its leader."""

    def leader_of(model: str) -> SchedulerServer | None:
        leading = [s for s in servers if agent_of(s).role_of(model) is Role.LEADING]
        return leading[0] if len(leading) == 1 else None

    def ok() -> bool:
        leases = len(agent_of(servers[0]).leases)
        if any(
            len({agent_of(s).lease_for(m).name for m in agent_of(s).leading}) > fair_share(leases, len(servers))
            for s in servers
        ):
            return False
        for model in models:
            leader = leader_of(model)
            if leader is None:
                return False
            holder = agent_of(leader).holder_of(model)
            for s in servers:
                if s is not leader and (
                    agent_of(s).role_of(model) is not Role.FOLLOWING or agent_of(s).leader_of(model) != holder
                ):
                    return False
        return True

    await eventually(ok, timeout, f"one leader for each of {models}, the others following it")
    return {model: leader for model in models if (leader := leader_of(model)) is not None}

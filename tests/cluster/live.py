"""Scheduler replica processes for the live cluster tests: each replica is its own
`python -m scheduler_svc.app.cli serve` process with its own gRPC and metrics ports and replica name, all meeting
on a real `redis-server` (the `redis_server` fixture) in front of one simulator; nothing is faked.

Roles are read the way an operator reads them, from each replica's `llmsched_cluster_role` gauge on
/metrics; what reached the engine, from the simulator's journal (one JSON line per request event).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from backends.metrics import MetricSamples
from backends.sim.journal import read_journal
from engines import free_port
from tests.cluster.redis_server import dies_with_parent
from tests.helpers import client_label

ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT = 0.2
TIMEOUT = 0.8
START_SECONDS = 30.0  # a replica process's start on a loaded two-core machine (imports dominate)
ROLES = ("leader", "follower", "degraded")


@dataclass
class Replica:
    """One scheduler process: its name, gRPC target, metrics URL and log."""

    name: str
    target: str
    metrics_url: str
    log_path: Path
    popen: subprocess.Popen[bytes]

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill9(self) -> None:
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait()

    def sigterm(self) -> None:
        self.popen.send_signal(signal.SIGTERM)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def became(self, role: str, model: str | None = None) -> list[float]:
        """Wall-clock times at which this replica logged entering `role` ("leading", "following", ...) on any
        lease, or on `model`'s: its own clock reading, without the lag of a scraper polling its gauge."""
        times = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if '"cluster_role_changed"' in line:
                entry = json.loads(line)
                if entry.get("role") == role and (model is None or model in entry.get("models", ())):
                    times.append(datetime.fromisoformat(entry["timestamp"]).timestamp())
        return times

    def role_changes(self, model: str) -> list[tuple[float, str]]:
        """(wall-clock time, role entered) of every change this replica logged on `model`'s lease."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if '"cluster_role_changed"' in line:
                entry = json.loads(line)
                if model in entry.get("models", ()):
                    out.append((datetime.fromisoformat(entry["timestamp"]).timestamp(), str(entry.get("role"))))
        return out


def replica_toml(
    name: str,
    grpc_port: int,
    metrics_port: int,
    sim_url: str,
    redis_url: str,
    key_prefix: str,
    *,
    waiting_target: int = 2,
    fallback_max_in_flight: int = 4,
    models: Sequence[str] = ("m",),
    heartbeat_timeout: float = TIMEOUT,
) -> str:
    """One replica's config: each of `models` ("m" alone by default) on simulator backend "b0", the cluster on
    Redis with fast heartbeats (names and leases live `heartbeat_timeout` seconds)."""
    model_tables = "".join(
        f"""
[[models]]
name = "{model}"
default_max_tokens = 16

[models.gate]
waiting_target = {waiting_target}
fallback_max_in_flight = {fallback_max_in_flight}

[[models.backends]]
name = "b0"
kind = "vllm"
url = "{sim_url}"
engine_model = "sim-model"
scrape_interval_seconds = 0.05
"""
        for model in models
    )
    return f"""
[server]
listen = "127.0.0.1:{grpc_port}"
metrics_listen = "127.0.0.1:{metrics_port}"
queue_update_interval_seconds = 0.05
shutdown_grace_seconds = 1.0
log_format = "json"
{model_tables}
[cluster]
store = "redis"
redis_url = "{redis_url}"
key_prefix = "{key_prefix}"
replica_name = "{name}"
heartbeat_interval_seconds = {HEARTBEAT}
heartbeat_timeout_seconds = {heartbeat_timeout}
admission_wait_seconds = 1.0
report_interval_seconds = 0.02
"""


def spawn_replica(
    name: str,
    directory: Path,
    sim_url: str,
    redis_url: str,
    models: Sequence[str] = ("m",),
    heartbeat_timeout: float = TIMEOUT,
    **gate: int,
) -> Replica:
    """Start one replica process (not waiting for it); its config and log go to `directory`."""
    grpc_port, metrics_port = free_port(), free_port()
    config = directory / f"{name}-{grpc_port}.toml"
    config.write_text(
        replica_toml(
            name,
            grpc_port,
            metrics_port,
            sim_url,
            redis_url,
            "live",
            models=models,
            heartbeat_timeout=heartbeat_timeout,
            **gate,
        )
    )
    log_path = directory / f"{name}-{grpc_port}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            dies_with_parent([sys.executable, "-m", "scheduler_svc.app.cli", "serve", "--config", str(config)]),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
        )
    return Replica(name, f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{metrics_port}", log_path, popen)


async def role_of(session: aiohttp.ClientSession, replica: Replica) -> str | None:
    """The replica's role by its `llmsched_cluster_role` gauge; None while joining or not answering."""
    try:
        async with session.get(replica.metrics_url + "/metrics") as response:
            samples = MetricSamples.parse(await response.text(), ("llmsched_cluster_role",))
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None
    for role in ROLES:
        if samples.total("llmsched_cluster_role", role=role) == 1.0:
            return role
    return None


async def leading(session: aiohttp.ClientSession, replica: Replica, models: Sequence[str]) -> list[str] | None:
    """The models the replica leads by its `llmsched_cluster_leading` gauges; None when it does not answer."""
    try:
        async with session.get(replica.metrics_url + "/metrics") as response:
            samples = MetricSamples.parse(await response.text(), ("llmsched_cluster_leading",))
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None
    return [m for m in models if samples.total("llmsched_cluster_leading", model=m) == 1.0]


async def metric(session: aiohttp.ClientSession, replica: Replica, name: str) -> float | None:
    """One series' total on the replica's /metrics (None when it does not answer)."""
    try:
        async with session.get(replica.metrics_url + "/metrics") as response:
            return MetricSamples.parse(await response.text(), (name,)).total(name)
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None


@dataclass
class RoleWatch:
    """Polls every replica's role gauge every `period` seconds; `history`: (monotonic time, {name: role})."""

    replicas: Sequence[Replica]
    period: float = 0.02
    history: list[tuple[float, dict[str, str | None]]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                alive = [r for r in self.replicas if r.alive]
                roles = await asyncio.gather(*(role_of(session, r) for r in alive))
                self.history.append((time.monotonic(), {r.name: role for r, role in zip(alive, roles, strict=True)}))
                self.changed.set()
                await asyncio.sleep(self.period)  # sampling another process's gauge: no event to wait on

    @property
    def now(self) -> dict[str, str | None]:
        return self.history[-1][1] if self.history else {}

    async def until(self, predicate: Any, timeout: float, what: str) -> float:
        """Wait until `predicate(roles)` holds for a fresh sample; the monotonic time of that sample."""
        deadline = time.monotonic() + timeout
        seen = len(self.history)
        while True:
            for at, roles in self.history[seen:]:
                if predicate(roles):
                    return at
            seen = len(self.history)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{what}: not within {timeout}s; roles now {self.now}")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)


def one_leader(roles: dict[str, str | None]) -> bool:
    """Exactly one replica leads and every other one follows."""
    values = list(roles.values())
    return values.count("leader") == 1 and values.count("follower") == len(values) - 1


@contextlib.asynccontextmanager
async def watching(replicas: Sequence[Replica]) -> AsyncIterator[RoleWatch]:
    watch = RoleWatch(replicas)
    task = asyncio.create_task(watch.run())
    try:
        yield watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def cluster(
    directory: Path,
    sim_url: str,
    redis_url: str,
    names: Sequence[str] = ("r1", "r2", "r3"),
    heartbeat_timeout: float = TIMEOUT,
    models: Sequence[str] = ("m",),
    **gate: int,
) -> AsyncIterator[tuple[list[Replica], RoleWatch]]:
    """Start the replicas (all at once), wait until one leads and the others follow it, yield them and a
    running `RoleWatch`; kill whatever is still alive afterwards."""
    replicas = [spawn_replica(name, directory, sim_url, redis_url, models, heartbeat_timeout, **gate) for name in names]
    try:
        async with watching(replicas) as watch:
            try:
                await watch.until(lambda r: len(r) == len(names) and one_leader(r), START_SECONDS, "cluster up")
            except AssertionError:
                logs = "\n".join(f"--- {r.name} (rc {r.popen.poll()}):\n{r.log_tail()}" for r in replicas)
                raise AssertionError(f"the cluster did not form; logs:\n{logs}") from None
            yield replicas, watch
    finally:
        for replica in replicas:
            if replica.alive:
                replica.popen.kill()
            replica.popen.wait()


@dataclass(frozen=True)
class EngineLog:
    """The simulator journal read back: per client request id, its engine events, in time order."""

    events: list[dict[str, Any]]

    @classmethod
    def read(cls, path: Path) -> EngineLog:
        return cls([e for e in read_journal(path) if "id" in e])

    def received(self) -> list[str]:
        """Client request ids in the order they reached the engine (one entry per arrival)."""
        return [client_label(str(e["id"])) for e in self.events if e["event"] == "received"]

    def times(self, event: str) -> list[float]:
        """Wall-clock times of every `event` line."""
        return [float(e["t"]) for e in self.events if e["event"] == event]

    def ended(self, event: str) -> set[str]:
        return {client_label(str(e["id"])) for e in self.events if e["event"] == event}

    def peak_live(self, *, received_after: float = 0.0, received_before: float = float("inf")) -> int:
        """Most requests at the engine at once (received, not yet ended), counting only those received
        between `received_after` and `received_before` (wall clock)."""
        live, peak, counted = 0, 0, set()
        for e in self.events:
            if e["event"] == "received" and received_after < float(e["t"]) < received_before:
                counted.add(e["id"])
                live += 1
                peak = max(peak, live)
            elif e["event"] in ("finished", "aborted", "failed") and e["id"] in counted:
                counted.discard(e["id"])
                live -= 1
        return peak

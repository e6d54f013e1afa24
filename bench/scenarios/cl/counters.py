"""What CL and CN read from every process at a moment: each replica's CPU and messages sent (its metrics), which
replica leads which model, and Redis's CPU and commands (INFO)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import redis.asyncio as aioredis

from bench.cluster import Cluster
from bench.product import MetricSamples


@dataclass
class Snapshot:
    """Counters of every process at one moment."""

    cpu: list[float]  # per replica, seconds
    redis_cpu: float
    commands: dict[str, int]  # Redis command -> calls so far
    messages: dict[str, float]  # message type -> sent so far, every replica summed


async def _metrics(session: aiohttp.ClientSession, url: str) -> MetricSamples:
    async with session.get(url + "/metrics") as response:
        return MetricSamples.parse(await response.text())


async def leaders(cluster: Cluster, models: Sequence[str]) -> dict[str, int]:
    """model -> index of the replica that leads it, read from each replica's metrics (`llmsched_cluster_leading`
    per model; a replica without it leads every model when its role gauge says leader)."""
    out: dict[str, int] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        samples = await asyncio.gather(*(_metrics(session, r.metrics_url) for r in cluster.replicas))
    for index, s in enumerate(samples):
        if s.has("llmsched_cluster_leading"):
            for model in models:
                if (s.total("llmsched_cluster_leading", model=model) or 0) >= 1:
                    out[model] = index
        elif (s.total("llmsched_cluster_role", role="leader") or 0) >= 1:
            out.update(dict.fromkeys(models, index))
    return out


async def snapshot(cluster: Cluster, redis: aioredis.Redis) -> Snapshot:
    info_cpu, stats = await asyncio.gather(redis.info("cpu"), redis.info("commandstats"))
    commands = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if isinstance(v, dict)}
    messages: dict[str, float] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        samples = await asyncio.gather(*(_metrics(session, r.metrics_url) for r in cluster.replicas))
    for s in samples:
        for labels in s.labels("llmsched_cluster_messages_sent_total"):
            kind = labels.get("type", "?")
            messages[kind] = messages.get(kind, 0.0) + (s.total("llmsched_cluster_messages_sent_total", type=kind) or 0)
    main = ("used_cpu_sys_main_thread", "used_cpu_user_main_thread")
    keys = main if all(k in info_cpu for k in main) else ("used_cpu_sys", "used_cpu_user")
    return Snapshot(
        [r.cpu_seconds() for r in cluster.replicas], sum(float(info_cpu[k]) for k in keys), commands, messages
    )


def delta(a: Snapshot, b: Snapshot) -> Snapshot:
    return Snapshot(
        [y - x for x, y in zip(a.cpu, b.cpu, strict=True)],
        b.redis_cpu - a.redis_cpu,
        {k: v - a.commands.get(k, 0) for k, v in b.commands.items() if v - a.commands.get(k, 0)},
        {k: v - a.messages.get(k, 0.0) for k, v in b.messages.items() if v - a.messages.get(k, 0.0)},
    )


async def redis_cpu_seconds(redis: aioredis.Redis) -> float:
    info = await redis.info("cpu")
    main = ("used_cpu_sys_main_thread", "used_cpu_user_main_thread")
    return sum(float(info[k]) for k in (main if all(k in info for k in main) else ("used_cpu_sys", "used_cpu_user")))


async def commands_run(redis: aioredis.Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values() if isinstance(v, dict))

"""CN's run: one real leader replica and synthetic followers on a private redis-server, an idle window, then
each offered rate in turn; and the highest rate it sustained."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import redis.asyncio as aioredis

from bench import harness
from bench.cluster import ClusterOptions, cluster
from bench.configs import SCHEDULED_MODEL
from bench.scenarios.cl.counters import commands_run, redis_cpu_seconds
from bench.scenarios.cl.followers import SyntheticFollowers
from bench.scenarios.cl.setups import CLParams, load_config
from bench.scenarios.common import divide, ms


async def leader_under_load(options: ClusterOptions, p: CLParams) -> dict[str, Any]:
    """One real leader replica and `load_followers` synthetic followers (`followers`) on a private
    redis-server: an idle window, then each offered rate for `load_step` seconds."""
    layout = options.layout(1, "redis")
    async with contextlib.AsyncExitStack() as stack:
        engine_url = await stack.enter_async_context(harness.fake_engine(p.tokens))
        config = load_config(engine_url, p.load_engines, p.load_engine_slots)
        running = await stack.enter_async_context(cluster(config, layout))
        leader = running.replicas[0]
        redis = aioredis.Redis.from_url(running.redis_url)
        stack.push_async_callback(redis.aclose)
        driver = SyntheticFollowers(
            running.redis_url,
            running.key_prefix,
            "r1",
            SCHEDULED_MODEL,
            followers=p.load_followers,
            tokens=p.tokens,
            heartbeat=(options.heartbeat_interval, options.heartbeat_timeout),
            users=p.users,
        )
        await driver.start()
        stack.push_async_callback(driver.aclose)
        cpu0, redis0 = leader.cpu_seconds(), await redis_cpu_seconds(redis)
        await asyncio.sleep(p.load_step)  # the idle window: heartbeats and scrapes only
        idle = (leader.cpu_seconds() - cpu0) / p.load_step
        redis_idle = (await redis_cpu_seconds(redis) - redis0) / p.load_step
        steps = []
        for rate in p.load_rates:
            cpu0, redis0, commands0 = leader.cpu_seconds(), await redis_cpu_seconds(redis), await commands_run(redis)
            figures = await driver.run(rate, p.load_step)
            cpu = leader.cpu_seconds() - cpu0 - idle * figures.seconds
            redis_cpu = await redis_cpu_seconds(redis) - redis0 - redis_idle * figures.seconds
            commands = await commands_run(redis) - commands0
            done = figures.ended
            steps.append(
                {
                    **figures.summary(),
                    "leader_cpu_per_request": divide(cpu, done),
                    "leader_core_share": divide(cpu + idle * figures.seconds, figures.seconds),
                    "redis_cpu_per_request": divide(redis_cpu, done),
                    "redis_commands_per_request": divide(commands, done),
                    "redis_cpu_per_command": divide(redis_cpu, commands),
                }
            )
            print(f"    {rate:g} req/s: leader {ms(steps[-1]['leader_cpu_per_request'], 3)} per request", flush=True)
    return {"leader_idle_cpu_per_second": idle, "redis_idle_cpu_per_second": redis_idle, "steps": steps}


def sustained(load: dict[str, Any], p: CLParams) -> dict[str, Any] | None:
    """The highest step whose requests all ended with a median grant latency under `sustained_latency`."""
    ok = [
        s
        for s in load["steps"]
        if s["ended"] == s["admitted"] and (s["grant_latency_p50"] or 0.0) <= p.sustained_latency
    ]
    return max(ok, key=lambda s: s["rate"], default=None)

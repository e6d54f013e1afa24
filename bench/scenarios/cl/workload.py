"""CL's run: an idle window, then a fixed rate of requests, each to a replica that leads no model, with every
process's counters read around both windows."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import redis.asyncio as aioredis

from bench.clients import ScheduledClient
from bench.records import RequestRecord
from bench.runner import RunContext
from bench.scenarios.cl.counters import delta, leaders, snapshot
from bench.scenarios.cl.setups import CLParams, model_name
from bench.scenarios.common import divide, errors
from clients import pb_grpc


async def body(run: RunContext, p: CLParams, models: int) -> dict[str, Any]:
    cluster = run.cluster
    assert cluster is not None and cluster.redis_url
    names = [model_name(i, models) for i in range(models)]
    led = await leaders(cluster, names)
    if sorted(led) != sorted(names):
        raise RuntimeError(f"not every model has a leader: {led}")
    followers = [i for i in range(len(cluster.replicas)) if i not in led.values()]
    if not followers:
        raise RuntimeError("every replica leads a model: no follower to send to")
    redis = aioredis.Redis.from_url(cluster.redis_url)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(redis.aclose)
        clients = {}
        for i in followers:
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(cluster.replicas[i].target))
            stub = pb_grpc.SchedulerServiceStub(channel)
            clients[i] = {m: ScheduledClient(stub, m, run.clock, run.mode.label) for m in names}
        idle0 = await snapshot(cluster, redis)
        await asyncio.sleep(p.duration)  # the idle window: heartbeats only
        idle1 = await snapshot(cluster, redis)
        idle = delta(idle0, idle1)
        idle_seconds = p.duration
        start = run.clock.now()
        load0 = await snapshot(cluster, redis)
        tasks: list[asyncio.Task[None]] = []
        records: list[tuple[str, RequestRecord]] = []
        n = 0
        while (due := start + n / p.rate) < start + p.duration:
            await asyncio.sleep(max(0.0, due - run.clock.now()))
            model = names[n % models]
            owner = followers[(n // models) % len(followers)]
            record = RequestRecord(user=f"user{n % p.users}", tag="load", sent=run.clock.now(), max_tokens=p.tokens)
            record.replica = owner
            records.append((model, record))
            tasks.append(asyncio.create_task(clients[owner][model].run(record, f"Leader cost probe {n}.")))
            n += 1
        _, pending = await asyncio.wait(tasks, timeout=p.timeout)
        for task in pending:
            task.cancel()
        load1 = await snapshot(cluster, redis)
        seconds = run.clock.now() - start
    load = delta(load0, load1)
    done = [(m, r) for m, r in records if r.completed]
    net = [c - i * seconds / idle_seconds for c, i in zip(load.cpu, idle.cpu, strict=True)]
    per_model = {m: sum(1 for x, _ in done if x == m) for m in names}
    leader_rows: list[dict[str, Any]] = []
    for index in sorted(set(led.values())):
        served = sum(per_model[m] for m, i in led.items() if i == index)
        leader_rows.append(
            {
                "replica": index,
                "models": sorted(m for m, i in led.items() if i == index),
                "requests": served,
                "cpu": load.cpu[index],
                "net_cpu": net[index],
                "cpu_per_request": divide(net[index], served),
            }
        )
    follower_cpu = sum(net[i] for i in followers)
    leaders_cpu = sum(net[i] for i in set(led.values()))
    redis_net = load.redis_cpu - idle.redis_cpu * seconds / idle_seconds
    commands = {
        k: max(0.0, v - idle.commands.get(k, 0) * seconds / idle_seconds) for k, v in sorted(load.commands.items())
    }
    return {
        "leaders": leader_rows,
        "followers": followers,
        "requests": len(done),
        "sent": len(records),
        "seconds": seconds,
        "follower_cpu_per_request": divide(follower_cpu, len(done)),
        "leader_cpu_per_request": divide(leaders_cpu, len(done)),
        "leader_over_follower": divide(leaders_cpu, follower_cpu),
        "worst_leader_over_follower": max(
            (divide(r["cpu_per_request"], divide(follower_cpu, len(done))) or 0.0 for r in leader_rows), default=None
        ),
        "idle_cpu_per_second": [c / idle_seconds for c in idle.cpu],
        "redis_cpu_per_request": divide(redis_net, len(done)),
        "redis_idle_cpu_per_second": idle.redis_cpu / idle_seconds,
        "redis_commands_per_request": {k: v / len(done) for k, v in commands.items() if done},
        "redis_commands_total_per_request": divide(sum(commands.values()), len(done)),
        "redis_cpu_per_command": divide(redis_net, sum(commands.values())),
        "messages_per_request": {k: v / len(done) for k, v in sorted(load.messages.items()) if done},
        "errors": errors(r for _, r in records),
    }

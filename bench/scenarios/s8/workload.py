"""One S8 setup: the replicas, a scheduler in front of them, every user's closed loops, the measuring window
and the latecomers sent through it."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import grpc

from bench import harness
from bench.clients import RunClock, ScheduledClient
from bench.configs import SCHEDULED_MODEL
from bench.records import RequestRecord
from bench.scenarios.s8.measures import figures, read_counters
from bench.scenarios.s8.replicas import ReplicaPair
from bench.scenarios.s8.setups import FLOODER, S8Params, Setup, question, scheduler_toml, system_prompt, users
from clients import pb_grpc


async def run_setup(pair: ReplicaPair, setup: Setup, p: S8Params) -> dict[str, Any]:
    """One setup: the replicas, a scheduler in front of them, the closed loops, the window, the latecomers."""
    backlogged = users(p)
    prompts = {user: system_prompt(user, p) for user in backlogged}
    async with contextlib.AsyncExitStack() as stack:
        replicas = await stack.enter_async_context(pair.run())
        sched = await stack.enter_async_context(
            harness.scheduler_process(scheduler_toml(setup, replicas, pair.max_num_seqs))
        )
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(sched.target))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        clock = RunClock()
        client = ScheduledClient(pb_grpc.SchedulerServiceStub(channel), SCHEDULED_MODEL, clock, setup.label)
        records: list[RequestRecord] = []
        stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        late: list[asyncio.Task[None]] = []

        async def worker(user: str, lane: int) -> None:
            n = 0
            while not stop.is_set():
                record = RequestRecord(user=user, tag="backlog", sent=clock.now(), max_tokens=p.answer_tokens)
                records.append(record)
                await client.run(record, prompts[user] + question(user, lane * 100_000 + n))
                n += 1
                if record.error is not None:
                    return  # a failing target would make this loop spin

        async def latecomer(user: str) -> None:
            record = RequestRecord(user=user, tag="latecomer", sent=clock.now(), max_tokens=p.answer_tokens)
            records.append(record)
            await client.run(record, system_prompt(user, p) + question(user, 0))

        try:
            for lane in range(max(p.flood_concurrency, p.concurrency)):  # interleaved: nobody arrives first
                for user in backlogged:
                    if lane < (p.flood_concurrency if user == FLOODER else p.concurrency):
                        tasks.append(asyncio.create_task(worker(user, lane)))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + p.timeout
            while not any(r.first_token is not None for r in records):
                if loop.time() > deadline:
                    raise TimeoutError("no token within the timeout")
                await asyncio.sleep(0.05)  # records fill in other tasks
            await asyncio.sleep(p.warmup)  # caches, counters and batches settle
            before = await read_counters(session, replicas)
            start = clock.now()
            for i, offset in enumerate(p.latecomer_offsets):
                await asyncio.sleep(max(0.0, start + offset - clock.now()))
                late.append(asyncio.create_task(latecomer(f"late{i}")))
            await asyncio.sleep(max(0.0, start + p.window - clock.now()))
            after = await read_counters(session, replicas)
            end = clock.now()
            stop.set()
            await asyncio.wait(late, timeout=p.timeout)
        finally:
            stop.set()
            for task in tasks + late:
                task.cancel()
            await asyncio.gather(*tasks, *late, return_exceptions=True)
    out = figures(records, backlogged, (start, end), before, after)
    out["requests"] = len(records)
    return out

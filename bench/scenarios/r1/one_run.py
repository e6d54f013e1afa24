"""One R1 run: one setup through one round's plan on the engine, with the samplers on; the raw records,
samples and CPU by role."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from bench import harness
from bench.clients import Client, DirectClient, RunClock, ScheduledClient
from bench.configs import (
    SCHEDULED_MODEL,
    STANDARD_CLASS,
    example_config,
    minimal_config,
    scheduler_config,
    validated_toml,
)
from bench.records import RequestRecord
from bench.scenarios.r1.engine import RealEngine, client_session, direct_once
from bench.scenarios.r1.sampling import Sample, engine_sampler, gate_sampler
from bench.scenarios.r1.setups import PRIORITY_GATE_TARGET, SLOTS, Plan, Setup
from clients import pb_grpc
from engines import layout


def _config(engine: RealEngine, setup: Setup) -> str:
    if setup.first_config:
        where = {"engine_url": engine.url, "model": SCHEDULED_MODEL, "engine_model": engine.model}
        if setup.first_config == "example":
            return validated_toml(example_config(**where, max_num_seqs=SLOTS))
        slots = SLOTS if setup.first_config == "minimal_slots" else 0
        return validated_toml(minimal_config(**where, max_num_seqs=slots))
    config = scheduler_config(
        engine_url=engine.url,
        model=SCHEDULED_MODEL,
        engine_model=engine.model,
        max_num_seqs=SLOTS,
        classes=STANDARD_CLASS,
        waiting_target=setup.waiting_target,
        priority_waiting_target=PRIORITY_GATE_TARGET,
        priority_scheduling=setup.engine_priorities,
        scrape_interval=setup.scrape_interval,
    )
    config["models"][0]["backends"][0]["kind"] = "vllm" if engine.kind == "sim" else engine.kind
    config["server"]["event_loop"] = setup.event_loop
    if setup.read_interval is not None:
        config["server"]["stream_read_interval_seconds"] = setup.read_interval
    if setup.adapt_seconds is not None:
        config["models"][0]["gate"]["waiting_target_adapt_seconds"] = setup.adapt_seconds
    if setup.group_at_engine is not None:
        config["server"]["stream_group_at_engine"] = setup.group_at_engine
    return validated_toml(config)


async def run_once(engine: RealEngine, setup: Setup, plan: Plan, baseline_src: Path | None) -> dict[str, Any]:
    """One setup, one round: returns the raw records and samples."""
    clock = RunClock()
    engine_samples: list[Sample] = []
    gates: list[dict[str, Any]] = []
    async with contextlib.AsyncExitStack() as stack:
        session = await stack.enter_async_context(client_session(engine.kind))
        idle = (await direct_once(session, engine, 16)).ttft
        client: Client
        if setup.scheduled:
            wrapper: list[str] = []
            if setup.baseline and baseline_src is not None:
                # -P: the other tree's packages, not those of the working directory (this checkout) first
                wrapper = ["env", f"PYTHONPATH={baseline_src}", sys.executable, "-P"]
            sched = await stack.enter_async_context(harness.scheduler_process(_config(engine, setup), wrapper))
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(sched.target))
            stub = pb_grpc.SchedulerServiceStub(channel)
            client = ScheduledClient(stub, SCHEDULED_MODEL, clock, setup.label)
            warm = RequestRecord(user="warm", tag="warm", sent=0.0, max_tokens=4)
            await client.run(warm, "warm up")  # the scheduler's first reading and connection
        else:
            client = DirectClient(session, engine.url, engine.model, clock, setup.label)
        records: list[RequestRecord] = []
        tasks: list[asyncio.Task[None]] = []

        def send(user: str, tag: str, tokens: int, prompt: str, priority: int | None = None) -> None:
            record = RequestRecord(user=user, tag=tag, sent=clock.now(), max_tokens=tokens)
            records.append(record)
            tasks.append(asyncio.create_task(client.run(record, prompt, engine_priority=priority)))

        def cpu_now() -> dict[str, float]:
            """CPU seconds so far by role: where a layout's cores go (the engine's roles, the scheduler, the
            load generator with its samplers)."""
            out = {**engine.cpu_by_role(), "load generator": time.process_time()}
            if setup.scheduled:
                out["scheduler"] = layout.cpu_seconds(sched.proc.popen.pid)
            return out

        cpu_before = cpu_now()
        clock.reset()
        samplers = [asyncio.create_task(engine_sampler(session, engine, clock, engine_samples))]
        if setup.scheduled:
            samplers.append(asyncio.create_task(gate_sampler(stub, clock, gates)))
        try:
            for i, tokens in enumerate(plan.flood_tokens):
                send("A", "flood", tokens, f"User A, batch item {i}: summarise this paragraph for me please.")
            for user, offset in plan.latecomers:
                await asyncio.sleep(max(0.0, offset - clock.now()))
                send(user, "late", 16, f"User {user} asks a short question.", setup.latecomer_priority)
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=600)
            cpu_after = cpu_now()
            cpu = {role: round(cpu_after[role] - cpu_before[role], 2) for role in cpu_after}
        finally:
            for task in [*samplers, *tasks]:
                task.cancel()
            await asyncio.gather(*samplers, *tasks, return_exceptions=True)
    return {"idle_ttft": idle, "records": records, "engine": engine_samples, "gates": gates, "cpu": cpu}

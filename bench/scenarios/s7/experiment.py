"""One S7 run: the simulator and the scheduler started, a warm-up, the flood with its faults and cancels, the
storms, then the journal read and every count taken three ways."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from bench import harness
from bench.product import read_journal
from bench.scenarios.s7.analysis import analyse, analyse_storms, engine_attempts, scrape
from bench.scenarios.s7.calls import Load
from bench.scenarios.s7.load import cancellers, duplicates, flood, oversized, rss_kb, sample_rss, storms
from bench.scenarios.s7.params import S7Params
from bench.scenarios.s7.stack import Stack, faults, scheduler_toml
from clients import pb_grpc


async def measure(p: S7Params, workdir: Path) -> dict[str, Any]:
    """Every figure of one run (`analysis.analyse` and `analysis.analyse_storms`, and the run's own: rates,
    times, memory, the journal); the simulator's journal is written into `workdir`."""
    stack = Stack(p, workdir)
    log: list[str] = []
    timeout = aiohttp.ClientTimeout(total=10)
    async with contextlib.AsyncExitStack() as stack_ctx:
        stack_ctx.callback(stack.stop)
        session = await stack_ctx.enter_async_context(aiohttp.ClientSession(timeout=timeout))
        await stack.start_sim()
        toml = scheduler_toml(p, stack.sim_url, stack.metrics_port)
        sched = await stack_ctx.enter_async_context(harness.scheduler_process(toml))
        channels = [
            await stack_ctx.enter_async_context(grpc.aio.insecure_channel(sched.target)) for _ in range(p.channels)
        ]
        load = Load([pb_grpc.SchedulerServiceStub(c) for c in channels], p)
        metrics_url = f"http://127.0.0.1:{stack.metrics_port}/metrics"
        pid = sched.proc.popen.pid

        # Warm up with the flood itself for a few seconds, so one-time growth (code paths first taken, gRPC's
        # and aiohttp's pools, metric children) is not charged to the requests the bound is about.
        await flood(load, p, time.monotonic() + p.warmup_seconds, kind="warmup")
        await asyncio.gather(*load.tasks, return_exceptions=True)
        warm_tags = {c.tag for c in load.calls}
        load.calls.clear()
        await asyncio.sleep(1.0)  # let the warm-up's garbage go before the idle reading
        idle_kb = rss_kb(pid)
        before = await scrape(session, metrics_url)

        peak = [idle_kb]
        stop_sampling = asyncio.Event()
        sampler = asyncio.create_task(sample_rss(pid, peak, stop_sampling))
        t0 = time.monotonic()
        stop_at = t0 + p.flood_seconds
        cancel_deadline = stop_at + 60.0
        faulting = asyncio.create_task(faults(stack, session, load, p, t0, log))
        flooded, *_ = await asyncio.gather(
            flood(load, p, stop_at),
            cancellers(load, "qcancel", "queued", p.queued_cancel_workers, p.queued_cancels, cancel_deadline),
            cancellers(load, "rcancel", "running", p.running_cancel_workers, p.running_cancels, cancel_deadline),
            duplicates(load, p, stop_at),
            oversized(load, p, stop_at),
        )
        await faulting
        load_end = time.monotonic() - t0
        pending = set(load.tasks)
        if pending:
            _, still = await asyncio.wait(pending, timeout=p.drain_timeout)
            for task in still:
                task.cancel()
            await asyncio.gather(*still, return_exceptions=True)
        drained = time.monotonic() - t0
        await asyncio.sleep(1.0)  # the last aborts reach the engine's journal
        after = await scrape(session, metrics_url)
        stop_sampling.set()
        await sampler
        storm_load = Load(load.stubs, p, prefix="storm")
        await storms(storm_load, p)
        after_storms = await scrape(session, metrics_url)
        scheduler_alive = sched.proc.popen.poll() is None
        lines = read_journal(stack.journal)

    by_tag, boots = engine_attempts(lines)
    storm_tags = {tag: attempts for tag, attempts in by_tag.items() if tag.startswith("storm:")}
    by_tag = {tag: attempts for tag, attempts in by_tag.items() if tag not in warm_tags and tag not in storm_tags}
    figures = analyse(load.calls, by_tag, before, after)
    figures.update(analyse_storms(storm_load.calls, storm_tags, after, after_storms))
    figures.update(
        {
            "flood_rate": flooded / p.flood_seconds,
            "capacity": p.capacity(),
            "load_seconds": load_end,
            "drained_seconds": drained,
            "idle_rss_mb": idle_kb / 1024,
            "peak_rss_mb": peak[0] / 1024,
            "rss_growth_mb": (peak[0] - idle_kb) / 1024,
            "rss_bound_mb": (p.max_queued_bytes * p.per_prompt_byte + p.max_queued * p.per_request_overhead) / 2**20,
            "journal_lines": len(lines),
            "journal_boots": boots,
            "scheduler_alive": scheduler_alive,
            "log": log,
            "journal": str(stack.journal),
        }
    )
    return figures

"""S6's workload: fixed-rate phases (open loop) and the ceiling (clients back to back), each with the
scheduler's CPU per request."""

from __future__ import annotations

import asyncio
from typing import Any

from bench.records import percentile
from bench.runner import RunContext
from bench.scenarios.common import divide, errors, minus
from bench.scenarios.s6.setups import S6Params


async def fixed_rate(run: RunContext, p: S6Params, rate: float, duration: float, tag: str) -> None:
    """Send requests on a fixed schedule (open loop) for `duration` seconds."""
    start = run.clock.now()
    n = 0
    while (due := start + n / rate) < start + duration:
        await asyncio.sleep(max(0.0, due - run.clock.now()))
        run.send(f"user{n % 8}", tag, p.tokens, f"Overhead probe {n}.")
        n += 1


async def phase(run: RunContext, p: S6Params, rate: float, tag: str) -> dict[str, Any]:
    """One fixed-rate phase: latency percentiles, the rate actually sent, the scheduler's CPU per request."""
    cpu0 = run.scheduler_cpu_seconds()
    t0 = run.clock.now()
    await fixed_rate(run, p, rate, p.duration, tag)
    sent_for = run.clock.now() - t0
    await run.wait_all(p.timeout)
    cpu = minus(run.scheduler_cpu_seconds(), cpu0)
    records = [r for r in run.records if r.tag == tag]
    done = [r for r in records if r.completed]
    latency = [r.finished - r.sent for r in done if r.finished is not None]
    ttft = [r.ttft for r in done if r.ttft is not None]
    return {
        "offered_rate": rate,
        "sent_rate": len(records) / sent_for if sent_for else None,
        "sent": len(records),
        "completed": len(done),
        "latency_p50": percentile(latency, 50),
        "latency_p99": percentile(latency, 99),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "scheduler_cpu_per_request": divide(cpu, len(done)),
    }


async def _ceiling(run: RunContext, p: S6Params) -> dict[str, Any]:
    """Many clients back to back: completed requests per second, and the scheduler's CPU share."""
    stop = asyncio.Event()
    run.closed_loop("ceiling", "ceiling", p.ceiling_concurrency, p.tokens, "Ceiling probe.", stop)
    await asyncio.sleep(1.0)  # reach a steady state first
    c0 = run.clock.now()
    cpu0 = run.scheduler_cpu_seconds()
    await asyncio.sleep(p.ceiling_duration)  # a fixed measuring window
    c1 = run.clock.now()
    cpu = minus(run.scheduler_cpu_seconds(), cpu0)
    stop.set()
    await run.wait_all(p.timeout)
    done = [r for r in run.records if r.tag == "ceiling" and r.completed and r.finished and c0 <= r.finished < c1]
    return {
        "rate": len(done) / (c1 - c0),
        "scheduler_cpu_per_request": divide(cpu, len(done)),
        "scheduler_cpu_share": divide(cpu, c1 - c0),
    }


async def body(run: RunContext, p: S6Params) -> dict[str, Any]:
    await fixed_rate(run, p, p.low_rate, p.warmup, "warmup")
    await run.wait_all(p.timeout)
    low = await phase(run, p, p.low_rate, "low")
    target = await phase(run, p, p.rate, "target")
    if run.mode.echo or run.mode.http:  # the echo and the HTTP door: the latency phases only
        return {"low": low, "target": target, "errors": errors(run.records)}
    ceiling = await _ceiling(run, p)
    return {"low": low, "target": target, "ceiling": ceiling, "errors": errors(run.records)}

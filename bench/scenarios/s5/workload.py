"""S5's workloads: a batch flood with interactive arrivals through it (after probing the idle engine), and the
interactive TPOT flood against the slow-stepping engine, measured on the engine's own metrics."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import grpc

from bench import harness
from bench.clients import RunClock, ScheduledClient
from bench.configs import SCHEDULED_MODEL, validated_toml
from bench.records import RequestRecord, percentile
from bench.runner import RunContext
from bench.scenarios.common import errors
from bench.scenarios.s5.setups import IDLE_BASELINE, IDLE_PROBES, S5Params, tpot_flood_config
from bench.scenarios.s5.tpot_flood import SLOW_STEPPING_FLAGS, FloodStats, measure_flood
from clients import pb_grpc


async def run_tpot_flood(p: S5Params) -> FloodStats:
    """The interactive flood through the scheduler against the slow-stepping simulator, measured on the
    engine's own metrics (`bench.scenarios.s5.tpot_flood`)."""
    async with harness.simulator(*SLOW_STEPPING_FLAGS) as url:
        toml = validated_toml(tpot_flood_config(url, "sim-model"))
        async with (
            harness.scheduler_process(toml) as scheduler,
            grpc.aio.insecure_channel(scheduler.target) as channel,
        ):
            clock = RunClock()
            client = ScheduledClient(pb_grpc.SchedulerServiceStub(channel), SCHEDULED_MODEL, clock, "tpot flood")
            records = [
                RequestRecord(
                    user=f"user{i % p.tpot_flood_users}", tag="interactive", sent=0.0, max_tokens=p.tpot_flood_tokens
                )
                for i in range(p.tpot_flood_requests)
            ]

            async def flood() -> None:
                await asyncio.gather(
                    *(
                        client.run(r, f"Interactive question {i}.", priority_class="interactive")
                        for i, r in enumerate(records)
                    )
                )

            return await measure_flood(
                url, flood, lambda: sum(1 for r in records if r.finished is None and r.error is None)
            )


async def body(run: RunContext, p: S5Params) -> dict[str, Any]:
    direct_priority = run.mode.engine_policy == "priority" and not run.mode.scheduled
    engine_priority = -1 if direct_priority else None  # interactive requests on the engine's priority queue
    idle_ttfts = []
    for i in range(IDLE_PROBES):  # one at a time: each sees the idle engine
        probe = run.send(
            "idle-probe",
            "idle",
            p.interactive_tokens,
            _chat_prompt(f"An interactive question {i}.", p.interactive_prompt_tokens),
            priority_class="interactive",
            engine_priority=engine_priority,
        )
        await run.wait_all(60)
        if probe.ttft is not None:
            idle_ttfts.append(probe.ttft)
    run.records.clear()
    run.clock.reset()
    run.probe.start()
    rng = random.Random(p.seed)
    for i in range(0 if run.mode.label == IDLE_BASELINE else p.batch_requests):
        tokens = rng.randint(p.batch_tokens_min, p.batch_tokens_max)
        run.send("batch", "batch", tokens, f"Batch job {i}: classify this document.", priority_class="batch")
    await asyncio.sleep(p.interactive_start)
    n = 0
    while run.clock.now() < p.interactive_end:
        run.send(
            f"user{n % 4}",
            "interactive",
            p.interactive_tokens,
            _chat_prompt(f"Interactive question {n}.", p.interactive_prompt_tokens),
            priority_class="interactive",
            engine_priority=engine_priority,
        )
        n += 1
        await asyncio.sleep(rng.expovariate(p.interactive_rate))  # Poisson arrivals
    batch = [r for r in run.records if r.tag == "batch"]
    await run.until(lambda: all(r.finished is not None or r.error for r in run.records), p.timeout)
    inter = [r for r in run.records if r.tag == "interactive"]
    end = run.clock.now()
    return {
        "idle_ttft": percentile(idle_ttfts, 50) if idle_ttfts else None,
        "interactive": _latencies(inter),
        "batch_completed": sum(1 for r in batch if r.completed) / len(batch) if batch else None,
        "batch_done_at": max((r.finished or end) for r in batch) if batch else None,
        "batch_tokens_per_s_during": _rate(batch, p.interactive_start, p.interactive_end),
        "batch_tokens_per_s_after": _rate(batch, p.interactive_end, min(end, p.interactive_end + 3.0)),
        "errors": errors(run.records),
        "_records": list(run.records),
        "_engine": [(s.t, s.waiting, s.running) for s in run.probe.samples],
    }


def _chat_prompt(question: str, tokens: int) -> str:
    """A prompt of about `tokens` tokens: earlier conversation, then the question."""
    history = "The user and the assistant talked about this before. " * (4 * tokens // 53 + 1)
    return history[: max(0, 4 * tokens - len(question) - 1)] + " " + question


def _latencies(records: list[RequestRecord]) -> dict[str, float | None]:
    ttft = [r.ttft for r in records if r.ttft is not None]
    tpot = [r.tpot for r in records if r.tpot is not None]
    return {
        "count": float(len(records)),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "tpot_p50": percentile(tpot, 50),
        "tpot_p99": percentile(tpot, 99),
    }


def _rate(records: list[RequestRecord], start: float, end: float) -> float | None:
    if end <= start:
        return None
    return sum(r.tokens_between(start, end) for r in records) / (end - start)

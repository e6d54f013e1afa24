"""S7's workload: the open-loop flood at ten times the engine's capacity, the cancellers, live duplicate ids,
oversized prompts, the cancel storms, and the scheduler's RSS sampled throughout."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from bench.scenarios.s7.calls import Load, StormRound
from bench.scenarios.s7.params import S7Params


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def flood(load: Load, p: S7Params, stop_at: float, kind: str = "flood") -> int:
    """Open loop at `flood_factor` times the engine's capacity, users in turn."""
    rate = p.flood_factor * p.capacity()
    start, n = time.monotonic(), 0
    while (due := start + n / rate) < stop_at:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        call = load.new(kind, f"{kind}-{n % p.flood_users}")
        load.start(call, load.run(call))
        n += 1
    return n


async def cancellers(load: Load, kind: str, phase: str, workers: int, wanted: int, stop_at: float) -> None:
    """`workers` users, each with one call at a time, cancelling it at `phase` until `wanted` were."""

    def done() -> int:
        return sum(1 for c in load.calls if c.kind == kind and c.cancel_phase == phase)

    async def worker(w: int) -> None:
        while done() < wanted and time.monotonic() < stop_at:
            call = load.new(kind, f"{kind}-{w}")
            await load.run(call, cancel_on=phase)
            if not call.admitted:
                await asyncio.sleep(0.2)  # refused by a cap: back off like a client told to retry

    await asyncio.gather(*(worker(w) for w in range(workers)))


async def duplicates(load: Load, p: S7Params, stop_at: float) -> None:
    """A user sends a request, and while it is live, another with the same request_id."""
    gap = (stop_at - time.monotonic()) / (p.duplicates + 1)
    for i in range(p.duplicates):
        first = load.new("dup-first", "dup", f"dup-{i}")
        admitted = asyncio.Event()
        load.start(first, load.run(first, admitted=admitted))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(admitted.wait(), 5.0)
        if first.admitted and not first.end:
            second = load.new("dup-second", "dup", f"dup-{i}")
            load.start(second, load.run(second))
        await asyncio.sleep(gap)  # spread over the flood


async def oversized(load: Load, p: S7Params, stop_at: float) -> None:
    gap = (stop_at - time.monotonic()) / (p.oversized + 1)
    for i in range(p.oversized):
        call = load.new("oversized", f"big-{i % 5}")
        load.start(call, load.run(call, prompt=load.prompt(call, p.max_prompt_bytes + 8 * 1024)))
        await asyncio.sleep(gap)  # spread over the flood


async def sample_rss(pid: int, peak: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError, ValueError):
            peak[0] = max(peak[0], rss_kb(pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


async def storms(load: Load, p: S7Params) -> None:
    """Cancel storms, one after another: a few users' streams, the first of them filling the engine and the
    rest queued behind it (each user within its caps), all cancelled at once; freed slots go to the next of
    them while the cancels land."""
    for round_ in range(p.storm_rounds):
        storm = asyncio.Event()
        calls = [load.new("storm", f"storm-{round_}-{i % p.storm_users}") for i in range(p.storm_streams)]
        admitted = [asyncio.Event() for _ in calls]
        watch = StormRound(p.max_num_seqs)
        tasks = [load.start(c, load.run_until(c, storm, a, watch)) for c, a in zip(calls, admitted, strict=True)]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30):
                await asyncio.gather(*(a.wait() for a in admitted), watch.full.wait())  # all queued, engine full
        storm.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(1.0)  # the last aborts reach the engine and its journal

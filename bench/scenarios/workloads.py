"""Workload pieces more than one scenario sends: an idle engine's time to first token, a flood from one user,
the flood's decode time, and a measuring window over a backlogged engine."""

from __future__ import annotations

import asyncio
import random
import statistics

from bench.records import RequestRecord
from bench.runner import RunContext


async def idle_probe(run: RunContext, tokens: int) -> RequestRecord:
    """One request on the idle engine (its time to first token is the scenario's yardstick), then a clean
    start: records cleared, the clock at zero, the engine probe sampling."""
    idle = run.send("idle-probe", "idle", tokens, "How fast is an idle engine?")
    await run.wait_all(60)
    run.records.clear()
    run.clock.reset()
    run.probe.start()
    return idle


def flood(run: RunContext, requests: int, tokens_min: int, tokens_max: int, seed: int) -> None:
    """User A sends `requests` at once, answers of tokens_min-tokens_max tokens (seeded: the same in every run),
    lengths spread so slots free at different times, as real answers do."""
    rng = random.Random(seed)
    for i in range(requests):
        tokens = rng.randint(tokens_min, tokens_max)
        run.send("A", "flood", tokens, f"User A, batch item {i}: summarise this paragraph for me please.")


def decode_median(records: list[RequestRecord]) -> float | None:
    """The median first-to-last-token time of the flood's completed requests: one request's decode time."""
    decode = [
        r.finished - r.first_token
        for r in records
        if r.tag == "flood" and r.finished is not None and r.first_token is not None and r.error is None
    ]
    return statistics.median(decode) if decode else None


async def first_token(run: RunContext, timeout: float) -> None:
    """Wait until some request of the run has its first token; TimeoutError after `timeout` seconds."""
    if not await run.until(lambda: any(r.first_token is not None for r in run.records), timeout):
        raise TimeoutError("no token within the timeout")


async def measuring_window(run: RunContext, warmup: float, window: float, timeout: float) -> tuple[float, float, float]:
    """Wait for the first token, then `warmup`, then measure for `window` seconds.

    Returns (start, end, engine output tokens/s over the window). Starting from the first token keeps a
    slow start-up on a busy machine from eating into the warm-up.
    """
    await first_token(run, timeout)
    await asyncio.sleep(warmup)  # let the batch composition settle
    start, before = await run.probe.generated_tokens()
    await asyncio.sleep(window)  # the measuring window itself
    end, after = await run.probe.generated_tokens()
    return start, end, (after - before) / (end - start)

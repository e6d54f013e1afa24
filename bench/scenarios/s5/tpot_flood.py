"""The TPOT-hold check: an interactive flood against an engine whose step slows with its batch.

The simulated engine runs `--max-num-seqs 16 --decode-base-ms 40 --decode-per-seq-ms 10`: 16 running give
200 ms per token, 11 give 150 ms. Through the scheduler with a 150 ms interactive TPOT limit, the engine's
mean TPOT over the flood must stay at most 10% above the limit while the engine keeps a batch no smaller
than the one whose step equals the limit, minus one (11 - 1 = 10 here). Both figures come from the
engine's own metrics, so the scheduler cannot flatter itself:

- TPOT: delta of the engine's inter-token-latency histogram (sum / count) from the flood's first send to
  its last token; p90 over 0.5 s windows of the same histogram.
- batch: `vllm:num_requests_running` sampled every 0.1 s while work is queued in the scheduler, that is
  while the clients have more requests outstanding than the engine holds (running + waiting).
- the limit's batch: nominally 11 (40 + 10 x 11 = 150 ms); on a loaded machine the simulator's steps run
  a few ms long, so the step's fixed cost is also measured from the same windows (median of window TPOT
  minus 10 ms per running request) and the target batch is the smaller of the two, minus one.

Used by S5 in `make bench` and by the test that runs every shipped config against this engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from bench.product import MetricSamples

SLOW_STEPPING = {"max_num_seqs": 16, "decode_base_ms": 40.0, "decode_per_seq_ms": 10.0}
SLOW_STEPPING_FLAGS = ("--max-num-seqs", "16", "--decode-base-ms", "40", "--decode-per-seq-ms", "10")
TPOT_TOLERANCE = 1.10  # the engine's mean TPOT over the flood at most this times the class limit
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
RUNNING, WAITING, GENERATED = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total"
WINDOW = 0.5  # seconds per TPOT window for the p90


def limit_batch(limit_seconds: float) -> int:
    """The largest batch whose step time on the slow-stepping engine is within the limit (150 ms: 11)."""
    base, per_seq = SLOW_STEPPING["decode_base_ms"], SLOW_STEPPING["decode_per_seq_ms"]
    return min(int(SLOW_STEPPING["max_num_seqs"]), math.floor((limit_seconds * 1000 - base) / per_seq + 1e-9))


@dataclass(frozen=True)
class _Reading:
    at: float
    itl_sum: float
    itl_count: float
    running: float
    waiting: float
    generated: float


@dataclass
class FloodStats:
    """What the engine did over one flood."""

    mean_tpot: float | None
    p90_tpot: float | None
    mean_running_queued: float | None
    queued_samples: int
    tokens_per_s: float | None
    span: float
    windows: list[float] = field(default_factory=list)
    step_line: tuple[float, float] | None = None  # (a, b): the engine's step = a + b * running, as measured

    def limit_batch(self, limit: float) -> int:
        """The largest batch whose step is within the limit: nominal, or as measured when smaller."""
        nominal = limit_batch(limit)
        if self.step_line is None or self.step_line[1] <= 0:
            return nominal
        a, b = self.step_line
        return max(1, min(nominal, math.floor((limit - a) / b + 1e-9)))

    def targets_met(self, limit: float) -> tuple[bool, bool]:
        """(TPOT held: mean at most 1.1x the limit, batch kept: mean running while queued >= limit batch - 1)."""
        tpot_ok = self.mean_tpot is not None and self.mean_tpot <= TPOT_TOLERANCE * limit
        batch_ok = self.mean_running_queued is not None and self.mean_running_queued >= self.limit_batch(limit) - 1
        return tpot_ok, batch_ok

    def describe(self, limit: float) -> str:
        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x * 1000:.0f} ms"

        batch = "-" if self.mean_running_queued is None else f"{self.mean_running_queued:.1f}"
        rate = "-" if self.tokens_per_s is None else f"{self.tokens_per_s:.0f}"
        line = (
            ""
            if self.step_line is None
            else f"; measured step {ms(self.step_line[0])} + {ms(self.step_line[1])} x running"
        )
        return (
            f"engine mean TPOT {ms(self.mean_tpot)} (limit {ms(limit)}, at most {ms(TPOT_TOLERANCE * limit)}), "
            f"p90 {ms(self.p90_tpot)} over {WINDOW:g} s windows; mean running while queued {batch} "
            f"(at least {self.limit_batch(limit) - 1}: nominal {limit_batch(limit) - 1}{line}; "
            f"{self.queued_samples} samples); {rate} tokens/s over {self.span:.1f} s"
        )


async def _read(session: aiohttp.ClientSession, url: str, at: float) -> _Reading | None:
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=2.0)) as response:
            samples = MetricSamples.parse(await response.text())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    name = next((n for n in ITL if samples.has(n + "_count")), ITL[0])
    return _Reading(
        at=at,
        itl_sum=samples.total(name + "_sum") or 0.0,
        itl_count=samples.total(name + "_count") or 0.0,
        running=samples.total(RUNNING) or 0.0,
        waiting=samples.total(WAITING) or 0.0,
        generated=samples.total(GENERATED) or 0.0,
    )


async def measure_flood(
    engine_url: str,
    flood: Callable[[], Awaitable[None]],
    outstanding: Callable[[], int],
    interval: float = 0.1,
) -> FloodStats:
    """Run `flood()` (sends the requests, returns when the last one ended) while sampling the engine.

    `outstanding()`: requests the clients sent that have not ended; work is queued in the scheduler while
    that is more than the engine holds.
    """
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session:
        first = await _read(session, engine_url, loop.time())
        if first is None:
            raise RuntimeError(f"the engine at {engine_url} does not answer /metrics")
        readings: list[_Reading] = [first]
        queued_running: list[float] = []

        async def sample() -> None:
            while True:
                await asyncio.sleep(interval)  # the sampling period itself
                reading = await _read(session, engine_url, loop.time())
                if reading is None:
                    continue
                readings.append(reading)
                if outstanding() > reading.running + reading.waiting:
                    queued_running.append(reading.running)

        sampler = asyncio.create_task(sample())
        try:
            await flood()
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        last = await _read(session, engine_url, loop.time())
    if last is not None:
        readings.append(last)
    end = readings[-1]
    tokens = end.itl_count - first.itl_count
    windows: list[float] = []
    points: list[tuple[float, float]] = []  # (mean running over the window, window TPOT)
    start, running = first, [first.running]
    for reading in readings[1:]:
        running.append(reading.running)
        if reading.at - start.at >= WINDOW and reading.itl_count > start.itl_count:
            windows.append((reading.itl_sum - start.itl_sum) / (reading.itl_count - start.itl_count))
            points.append((sum(running) / len(running), windows[-1]))
            start, running = reading, [reading.running]
    span = end.at - first.at
    return FloodStats(
        mean_tpot=(end.itl_sum - first.itl_sum) / tokens if tokens > 0 else None,
        p90_tpot=sorted(windows)[min(len(windows) - 1, int(0.9 * len(windows)))] if windows else None,
        mean_running_queued=sum(queued_running) / len(queued_running) if queued_running else None,
        queued_samples=len(queued_running),
        tokens_per_s=(end.generated - first.generated) / span if span > 0 else None,
        span=span,
        windows=windows,
        step_line=_line(points),
    )


def _line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """The engine's step line as it ran: the nominal per-request cost (the simulator's own sleep, exact)
    and the fixed cost measured as the median of `window TPOT - per-request cost x mean running` (a loaded
    machine adds to every step, not per request; the median ignores the windows where a wave ended)."""
    per_seq = SLOW_STEPPING["decode_per_seq_ms"] / 1000
    fixed = sorted(y - per_seq * x for x, y in points if x >= 1)
    if len(fixed) < 3:
        return None
    return fixed[len(fixed) // 2], per_seq

"""R1's figures of one run: latecomers' time to first token, the flood's span and rates, how full the slots
were while work waited, the engine's own steps, and the split of a latecomer's wait into the engine's
slot turnover and its path to a first token."""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.records import RequestRecord
from bench.scenarios.common import median
from bench.scenarios.r1.sampling import Sample
from bench.scenarios.r1.setups import SLOTS


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median_and_p90(name: str, values: Sequence[float]) -> dict[str, float | None]:
    """`name` and `name`_p90: the median and 90th percentile of `values` pooled over a setup's rounds."""
    return {name: median(values), f"{name}_p90": nearest_rank(values, 0.9)}


def next_slot_waits(ends: Sequence[float], arrivals: Sequence[float]) -> list[float]:
    """For each arrival, the seconds until the next request ends after it (a slot frees), as the clients saw
    the ends; arrivals after the last end are left out."""
    ordered = sorted(ends)
    waits = []
    for t in arrivals:
        i = bisect.bisect_right(ordered, t)
        if i < len(ordered):
            waits.append(ordered[i] - t)
    return waits


# two ends closer than this came out of the same engine step: under the shortest step R1 has seen on the CPU
# engine (2.2 ms), so that ends of consecutive steps never chain into one
SAME_STEP = 0.0015


def first_fill_spread(flood: Sequence[RequestRecord]) -> float | None:
    """How far apart the flood's first `SLOTS` requests got their first tokens: about 0 when the engine's
    first batch filled at once. Equal-length answers keep each slot on the phase it started on, so a first
    batch filled one request at a time leaves the slots ending apart for the whole flood."""
    firsts = sorted(r.first_token for r in flood if r.first_token is not None)[:SLOTS]
    return firsts[-1] - firsts[0] if len(firsts) == SLOTS else None


def ends_apart(records: Sequence[RequestRecord]) -> float | None:
    """The share of request ends that came out of a step of their own (more than `SAME_STEP` after the
    previous end). After each such step the engine's running count reads one or more short until its next
    step admits waiting work, so a sample can read a slot empty that no step ran empty."""
    ends = sorted(r.finished for r in records if r.finished is not None)
    if not ends:
        return None
    apart = 1 + sum(1 for before, end in itertools.pairwise(ends) if end - before > SAME_STEP)
    return apart / len(ends)


def turnover_split(records: Sequence[RequestRecord]) -> tuple[list[float], list[float]]:
    """A latecomer's time to first token is mostly the wait for the engine's next free slot (every slot
    busy with the flood, the engine's priority queue puts it first) plus the path to and from the engine.
    This splits the two: the next-slot wait for an arrival at every 10 ms of the latecomers' window (how
    often this setup's engine turns a slot over, whatever moments the latecomers happened to pick), and
    each latecomer's first token after the first slot that freed once it was sent (the path; negative
    when its client saw that end late)."""
    late = [r for r in records if r.tag == "late" and r.first_token is not None]
    if not late:
        return [], []
    lo, hi = min(r.sent for r in late), max(r.sent for r in late)
    grid = [lo + i * 0.01 for i in range(int((hi - lo) / 0.01) + 1)]
    ends = sorted(r.finished for r in records if r.finished is not None)
    turnover = next_slot_waits(ends, grid)
    path = []
    for r in late:
        i = bisect.bisect_right(ends, r.sent)
        if i < len(ends) and ends[i] == r.finished:  # its own end is no slot freed for it
            i += 1
        if i < len(ends) and r.ttft is not None:
            path.append(r.ttft - (ends[i] - r.sent))
    return turnover, path


@dataclass(frozen=True)
class EngineSteps:
    """The engine's own step count through the flood, from its step counter: a flood's span is about the
    steps the engine took times the wall time each took. Steps are mostly what a scheduler controls (a thin
    batch needs more of them for the same tokens); the time per step mostly the engine's speed (here, on a
    shared noisy host, it varied 3.4-4.9 ms between rounds of one setup at the same batch). Only mostly:
    the time per step is wall time over steps, so an engine left idle inside the flood shows there, and a
    step's time grows with its batch."""

    steps: float  # steps over the sampled part of the flood
    tokens_per_step: float  # output tokens per step: the engine's mean batch, by its own count
    seconds_per_step: float


# the samples must have seen this share of the flood's tokens counted, or their counters lagged the engine
STEP_COVERAGE = 0.95


def engine_steps(samples: Sequence[Sample], start: float, end: float, flood_tokens: int) -> EngineSteps | None:
    """Steps between the first and the last sample inside [start, end]. None without a step series, and
    when those samples counted less than `STEP_COVERAGE` of the flood's tokens (a lower bound: the engine's
    counter also counts the latecomers' tokens): a front end starved of CPU
    (the all-shared layout) updates its counters in bursts seconds late, and answers /metrics late too,
    so its counts say when it caught up, not when the engine stepped."""
    inside = [s for s in samples if start <= s.t <= end and s.steps is not None]
    if len(inside) < 2:
        return None
    first, last = inside[0], inside[-1]
    assert first.steps is not None and last.steps is not None
    steps = last.steps - first.steps
    generated = last.generated - first.generated
    if steps <= 0 or generated < STEP_COVERAGE * flood_tokens:
        return None
    return EngineSteps(steps, generated / steps, (last.t - first.t) / steps)


def run_figures(run: dict[str, Any]) -> dict[str, Any]:
    """One run's figures."""
    records: list[RequestRecord] = run["records"]
    samples: list[Sample] = run["engine"]
    flood = [r for r in records if r.tag == "flood"]
    late = [r for r in records if r.tag == "late"]
    start = min(r.sent for r in flood)
    end = max((r.finished or 0.0) for r in flood)
    span = end - start
    inside = [s for s in samples if start <= s.t <= end]

    def rate(lo: float, hi: float) -> float | None:
        window = [s for s in samples if lo <= s.t <= hi]
        if len(window) < 2 or window[-1].t <= window[0].t:
            return None
        return (window[-1].generated - window[0].generated) / (window[-1].t - window[0].t)

    def queued_at(t: float) -> int:
        return sum(1 for r in records if r.sent <= t and (r.first_token is None or r.first_token > t))

    with_work = [s for s in inside if queued_at(s.t) > 0]
    full = [s for s in with_work if s.running >= SLOTS]
    # a slot empty while the engine itself holds waiting work is the engine between a finish and its next
    # step (every setup shows those); one empty with nothing waiting there is work held back before it
    starved = [s for s in with_work if s.running < SLOTS and s.waiting == 0]
    between_steps = [s for s in with_work if s.running < SLOTS and s.waiting > 0]  # see `ends_apart`
    decode = [r.finished - r.first_token for r in flood if r.finished is not None and r.first_token is not None]
    late_ttft = [r.ttft for r in late if r.ttft is not None]
    turnover, path = turnover_split(records)
    steps = engine_steps(samples, start, end, sum(r.tokens for r in flood))
    return {
        "turnover_wait": median(turnover),
        "late_path": path,
        "late_hop": [h for r in late if (h := r.scheduler_hop) is not None],
        "late_queue_wait": [r.scheduler_queue_wait for r in late if r.scheduler_queue_wait is not None],
        "late_intake": [r.intake for r in late if r.intake is not None],
        "idle_ttft": run["idle_ttft"],
        "late_ttft": late_ttft,
        "late_missing": sum(1 for r in late if r.ttft is None),
        "late_after_flood": sum(1 for r in late if r.sent > end),  # not behind the flood: an idle engine's TTFT
        "errors": sorted({r.error for r in records if r.error}),
        "span": span,
        "tps_flood": rate(start, end),
        "tps_window": rate(start + span * 0.25, start + span * 0.75),
        "full_share": len(full) / len(with_work) if with_work else None,
        "starved_share": len(starved) / len(with_work) if with_work else None,
        "between_steps_share": len(between_steps) / len(with_work) if with_work else None,
        "ends_apart": ends_apart(records),
        "first_fill_spread": first_fill_spread(flood),
        "mean_running": statistics.fmean(s.running for s in inside) if inside else None,
        "decode": median(decode),
        "samples": len(inside),
        "steps": steps.steps if steps else None,
        "tokens_per_step": steps.tokens_per_step if steps else None,
        "step_seconds": steps.seconds_per_step if steps else None,
        "cpu": run.get("cpu", {}),
    }

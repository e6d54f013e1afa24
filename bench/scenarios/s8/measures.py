"""S8's figures: the engines' prefix-cache and generation counters summed over the replicas, and per setup the
hit rate, throughput, TTFT, Jain's index of the users' tokens, the largest deficit and the latecomers."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, cast

import aiohttp

from bench.product import MetricSamples
from bench.records import RequestRecord, percentile
from bench.scenarios.common import divide
from bench.scenarios.s8.replicas import Replica

GENERATED = "vllm:generation_tokens_total"
QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one gets everything."""
    squares = sum(v * v for v in values)
    return None if not values or squares == 0 else sum(values) ** 2 / (len(values) * squares)


def largest_deficit(values: Sequence[float]) -> float:
    """How far the least served fell below the equal share (the mean), in the values' unit."""
    return statistics.fmean(values) - min(values) if values else 0.0


def counter_delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def figures(
    records: Sequence[RequestRecord],
    backlogged: Sequence[str],
    window: tuple[float, float],
    before: dict[str, float],
    after: dict[str, float],
) -> dict[str, Any]:
    """One run's figures from its records and the engines' summed counters at the window's edges."""
    start, end = window
    tokens = {user: 0 for user in backlogged}
    for record in records:
        if record.user in tokens:
            tokens[record.user] += record.tokens_between(start, end)
    ttfts = [
        r.ttft
        for r in records
        if r.user in tokens and r.ttft is not None and r.first_token is not None and start <= r.first_token < end
    ]
    late = [r for r in records if r.tag == "latecomer"]
    late_ttft = [r.ttft for r in late]
    queries = counter_delta(before, after, QUERIES)
    values = list(tokens.values())
    return {
        "hit_rate": divide(counter_delta(before, after, HITS), queries),
        "tokens_per_second": counter_delta(before, after, GENERATED) / (end - start),
        "ttft_mean": statistics.fmean(ttfts) if ttfts else None,
        "ttft_p99": percentile(ttfts, 99),
        "jain": jain_index(values),
        "largest_deficit": largest_deficit(values),
        "largest_deficit_share": divide(largest_deficit(values), statistics.fmean(values) if values else None),
        "tokens": tokens,
        "latecomer_ttft": late_ttft,
        "latecomer_median": None
        if not late_ttft or None in late_ttft
        else statistics.median(cast(list[float], late_ttft)),
        "prefix_queries": queries,
        "window": [start, end],
        "errors": sorted({r.error for r in records if r.error and r.error != "cancelled"}),
    }


async def read_counters(session: aiohttp.ClientSession, replicas: Sequence[Replica]) -> dict[str, float]:
    """The engines' generation and prefix-cache counters, summed over the replicas (retried: a busy machine
    can delay an answer)."""
    out = {GENERATED: 0.0, QUERIES: 0.0, HITS: 0.0}
    for replica in replicas:
        for attempt in range(3):
            try:
                async with session.get(replica.url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as response:
                    samples = MetricSamples.parse(await response.text())
                break
            except (aiohttp.ClientError, TimeoutError):
                if attempt == 2:
                    raise RuntimeError(f"engine at {replica.url} did not answer /metrics") from None
        for name in out:
            out[name] += samples.total(name) or 0.0
    return out


def hit_rate_ratio(run: dict[str, Any], baseline: dict[str, Any]) -> float | None:
    """Hit rate ÷ the baseline's (infinite when the baseline hit nothing and this hit something)."""
    if run["hit_rate"] is None or baseline["hit_rate"] is None:
        return None
    if baseline["hit_rate"] == 0:
        return float("inf") if run["hit_rate"] > 0 else None
    return float(run["hit_rate"] / baseline["hit_rate"])

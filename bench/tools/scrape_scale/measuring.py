"""The ways of reading a hundred engines, each timed inside the real `Scheduler` in this process: CPU per
scrape, the share of a core at the interval, and the event loop's lag; and the parse alone of each text."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from bench.product import (
    BackendLoad,
    HttpAdapter,
    MetricSamples,
    SampleParser,
    Scheduler,
    load_config,
    whole_text_samples,
)
from bench.tools.scrape_scale.texts import ADAPTER_KIND, ADAPTERS, ENGINE_MODEL, text_read

LAG_TIMER = 0.02  # 50 wakes a second (a 5 ms probe alone would cost about 7% of the CPU it measures)


def prometheus_client_parse(text: str, names: tuple[str, ...] | None = None) -> MetricSamples:
    """The reading the scan replaced: prometheus-client's parser over the lines that start with a wanted name."""
    if names is not None:
        text = "\n".join(line for line in text.splitlines() if line.startswith(names)) + "\n"
    return MetricSamples(whole_text_samples(text))


PARSERS: dict[str, SampleParser] = {"prometheus-client": prometheus_client_parse, "scan": MetricSamples.parse}


@dataclass(frozen=True)
class Variant:
    label: str
    parser: str  # a key of PARSERS
    own_connection: bool  # the reader's kept-alive connection (as shipped), or aiohttp's client
    spread: bool  # ten engines a beat, the beats spread over the interval (as shipped), or every engine on one beat


BEFORE = Variant("before", "prometheus-client", own_connection=False, spread=False)
SHIPPED = Variant("shipped", "scan", own_connection=True, spread=True)
PARSE_BEFORE = Variant("shipped, parse as before", "prometheus-client", own_connection=True, spread=True)
CLIENT_BEFORE = Variant("shipped, aiohttp's client", "scan", own_connection=False, spread=True)
AT_ONCE = Variant("shipped, one beat for all", "scan", own_connection=True, spread=False)
VARIANTS = (BEFORE, SHIPPED, PARSE_BEFORE, CLIENT_BEFORE, AT_ONCE)


@dataclass(frozen=True)
class Window:
    """One measuring window of one variant."""

    kind: str
    variant: Variant
    cpu_per_scrape_us: float
    scrapes_per_second: float
    share_measured: float  # CPU seconds per wall second
    share_at_interval: float  # CPU per scrape x engines / interval: exactly at the shipped rate
    lag_p99_ms: float
    lag_max_ms: float
    failing_engines: int


def _config(kind: str, urls: Sequence[str], interval: float) -> Any:
    return load_config(
        {
            "server": {"log_level": "warning"},
            "models": [
                {
                    "name": "m",
                    "backends": [
                        {
                            "name": f"engine-{i}",
                            "kind": ADAPTER_KIND[kind],
                            "url": url,
                            "engine_model": ENGINE_MODEL[kind],
                            "scrape_interval_seconds": interval,
                        }
                        for i, url in enumerate(urls)
                    ],
                }
            ],
        }
    )


async def _lag_probe(lags: list[float]) -> None:
    """How late a LAG_TIMER sleep ends, again and again (perf_counter: uvloop's own clock ticks in ms)."""
    while True:
        start = time.perf_counter()
        await asyncio.sleep(LAG_TIMER)
        lags.append(time.perf_counter() - start - LAG_TIMER)


def _reads(reading: BackendLoad | None, failure: BackendLoad | None) -> bool:
    """Whether an engine's latest scrape succeeded."""
    return reading is not None and (failure is None or failure.read_at < reading.read_at)


async def measure(kind: str, urls: Sequence[str], variant: Variant, interval: float, seconds: float) -> Window:
    """The real scheduler reading `urls` at `interval` with `variant`'s parser and spreading, over `seconds`."""
    scheduler = Scheduler(_config(kind, urls, interval), spread_scrapes=variant.spread)
    handles = scheduler.dispatchers["m"].backends
    reads = [0]
    parse = PARSERS[variant.parser]

    def counted(text: str, names: tuple[str, ...] | None) -> MetricSamples:
        reads[0] += 1
        return parse(text, names)

    for handle in handles:  # the adapter's own reader, with the variant's parser and client
        reader = cast(HttpAdapter, handle.backend)._engine._metrics
        reader.parse = counted
        if not variant.own_connection:
            reader.close()
            reader._connection = None  # aiohttp's session from the first read on
    lags: list[float] = []
    running = asyncio.create_task(scheduler.run())
    probe = asyncio.create_task(_lag_probe(lags))
    try:
        await asyncio.sleep(max(1.0, 5 * interval))  # connections opened, selection learned, phases settled
        cpu, wall, before = time.process_time(), time.monotonic(), reads[0]
        lags.clear()
        await asyncio.sleep(seconds)
        cpu, wall, scrapes = time.process_time() - cpu, time.monotonic() - wall, reads[0] - before
        failing = sum(1 for h in handles if not _reads(h.estimator.reading, h.estimator.last_failure))
    finally:
        for task in (probe, running):
            task.cancel()
        await asyncio.gather(probe, running, return_exceptions=True)
        await scheduler.aclose()
    per_scrape = cpu / max(1, scrapes)
    lags.sort()
    return Window(
        kind=kind,
        variant=variant,
        cpu_per_scrape_us=per_scrape * 1e6,
        scrapes_per_second=scrapes / wall,
        share_measured=cpu / wall,
        share_at_interval=per_scrape * len(urls) / interval,
        lag_p99_ms=1000 * lags[int(0.99 * (len(lags) - 1))] if lags else 0.0,
        lag_max_ms=1000 * lags[-1] if lags else 0.0,
        failing_engines=failing,
    )


def parse_costs(texts: dict[str, str], kinds: Sequence[str], budget: float = 0.5) -> dict[str, dict[str, float]]:
    """Microseconds of CPU per parse of each kind's text the way the adapter reads it, per parser."""
    costs: dict[str, dict[str, float]] = {}
    for kind in kinds:
        text, names = text_read(kind, texts), ADAPTERS[kind].METRICS
        costs[kind] = {}
        for parser, parse in PARSERS.items():
            count, start = 0, time.process_time()
            while (spent := time.process_time() - start) < budget:
                for _ in range(20):
                    parse(text, names)
                count += 20
            costs[kind][parser] = spent / count * 1e6
    return costs


async def run(args: argparse.Namespace, urls: dict[str, list[str]]) -> list[Window]:
    """Every way of reading, for every kind, `args.rounds` times; the ways' order alternates between rounds."""
    windows: list[Window] = []
    for round_no in range(args.rounds):
        for kind in args.kinds:
            order = VARIANTS if round_no % 2 == 0 else tuple(reversed(VARIANTS))
            for variant in order:
                window = await measure(kind, urls[kind], variant, args.interval, args.seconds)
                print(
                    f"round {round_no + 1} {kind:10s} {variant.label:26s} {window.cpu_per_scrape_us:6.0f} us/scrape "
                    f"{100 * window.share_at_interval:5.1f}% lag max {window.lag_max_ms:5.1f} ms",
                    flush=True,
                )
                windows.append(window)
    return windows

"""What reading a hundred engines' metrics costs the scheduler: CPU per scrape, and the share of a core.

Why: the scheduler reads every engine's Prometheus metrics each `scrape_interval_seconds` (0.2 s as
shipped), so a hundred engines are 500 scrapes a second, each an HTTP GET, a parse and a `BackendLoad`, on
the event loop that also makes every dispatch decision. Target: a hundred engines at the shipped interval
take at most 10% of a core. (bench/scrape_cost.py measures the other side: the engine's CPU to answer.)

A child process serves recorded engine texts (tests/engines/data: vLLM 0.32 and llama-server; for TGI, of
which no recording exists here, the simulator's exporter after a few requests) from `--engines` aiohttp
endpoints per kind on loopback. This process runs the real `Scheduler` (one model, `--engines` backends of
one kind, nothing queued: dispatch loops, monitors, adapters, gates as shipped) and reads its own CPU time
over `--seconds`: per scrape (all of the process's CPU divided by the scrapes, so the idle loops count
against the scrapes) and as a share of a core at the interval. Kinds:

- vllm: asks for its samples by `name[]` at /metrics/, answered as vLLM's prometheus-client app answers
  (2 KB, chunked, gzipped for a client that accepts it, as aiohttp's does);
- vllm_whole: a vLLM that does not select (404 at /metrics/): the whole 55 KB, every scrape;
- llamacpp: llama-server's 2.6 KB; tgi: TGI's exporter, 11 KB.

Side by side, in alternating order every round, five ways of reading:

- before: prometheus-client's parser over the lines that start with a wanted name, aiohttp's client, every
  engine on one beat (the reading this replaced, which started every monitor together; it then slept an
  interval after each read, so its reads drifted apart over minutes and cost more than this measures);
- shipped: the adapters' scan (`backends._prom_scan`), the reader's own kept-alive connection
  (`backends._metrics_connection`), ten engines a beat, the beats spread over the interval;
- shipped but one part as before (prometheus-client's parser; aiohttp's client; every engine on one beat):
  what each part is worth on its own.

All five build the selecting URL once and decode the body as the reader now does. Besides CPU, the event
loop's lag (how late a 5 ms timer fires, p99 and worst): how long a dispatch decision can wait behind a burst
of scrapes. The timer's own CPU counts in every way's figures alike. It also prints the parse alone of each
text (no HTTP), before against the scan.

    .venv/bin/python -m bench.scrape_scale                      # 100 engines per kind, 3 rounds of 4 s
    .venv/bin/python -m bench.scrape_scale --engines 20 --rounds 1 --seconds 2 --kinds vllm
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gzip
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Metric, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from backends.adapters import HttpAdapter
from backends.adapters.llamacpp import LlamaCppBackend
from backends.adapters.tgi import TgiBackend
from backends.adapters.vllm import VllmBackend
from backends.base import BackendLoad
from backends.metrics import MetricSamples, whole_text_samples
from backends.metrics_reader import SampleParser
from backends.sim import SimConfig, running_simulator
from scheduler_svc.app.event_loop import EVENT_LOOPS, run_on
from scheduler_svc.app.logs import configure_logging
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.config import BackendConfig, ServerConfig
from scheduler_svc.dispatch.scheduler import Scheduler

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "engines" / "data"
KINDS = ("vllm", "vllm_whole", "llamacpp", "tgi")
ADAPTERS: dict[str, type[HttpAdapter]] = {
    "vllm": VllmBackend,
    "vllm_whole": VllmBackend,
    "llamacpp": LlamaCppBackend,
    "tgi": TgiBackend,
}
ENGINE_MODEL = {"vllm": "tiny-llama", "vllm_whole": "tiny-llama", "llamacpp": "tiny-llama-gguf", "tgi": "sim-model"}
ADAPTER_KIND = {"vllm": "vllm", "vllm_whole": "vllm", "llamacpp": "llamacpp", "tgi": "tgi"}
TARGET_SHARE = 0.10  # of one core, for a hundred engines at the shipped interval
TARGET_KINDS = ("vllm", "llamacpp", "tgi")  # how the adapters read the engines as shipped (vllm selects)
LAG_TIMER = 0.005


def shipped(field: str, schema: Any) -> Any:
    """A config field's documented default, from the schema itself."""
    return next(f.default for f in dataclasses.fields(schema) if f.name == field)


# --- the texts the engines answer ---------------------------------------------------------------------------


class _Replayed:
    """A collector writing parsed families again: what prometheus-client's exposition app serves."""

    def __init__(self, text: str) -> None:
        self.families: list[Metric] = list(text_string_to_metric_families(text))

    def collect(self) -> list[Metric]:
        return self.families


def selected_text(text: str, names: Sequence[str]) -> str:
    """What vLLM's prometheus-client app answers to `name[]=...`: the samples so called, with their comments."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_Replayed(text))
    return generate_latest(registry.restricted_registry(names)).decode()


async def tgi_text() -> str:
    """The simulator's TGI exporter text after a few requests (TGI writes counters without `_total` and
    35-bucket histograms, none of which a recording here shows)."""
    config = SimConfig(flavor="tgi", decode_base_ms=1.0, decode_per_seq_ms=0.1)
    async with running_simulator(config) as sim, aiohttp.ClientSession() as session:
        for n in range(5):
            body = {"inputs": f"request {n}", "parameters": {"max_new_tokens": 8}}
            async with session.post(sim.url + "/generate_stream", json=body) as response:
                await response.read()
        async with session.get(sim.url + "/metrics") as response:
            return await response.text()


async def engine_texts() -> dict[str, str]:
    """Each kind's whole /metrics text."""
    vllm = (DATA / "vllm_metrics.txt").read_text()
    return {
        "vllm": vllm,
        "vllm_whole": vllm,
        "llamacpp": (DATA / "llamacpp_metrics.txt").read_text(),
        "tgi": await tgi_text(),
    }


def text_read(kind: str, texts: dict[str, str]) -> str:
    """The text the adapter reads at each scrape of `kind`."""
    names = ADAPTERS[kind].METRICS
    return selected_text(texts[kind], names) if kind == "vllm" and names else texts[kind]


# --- the serving child ------------------------------------------------------------------------------------------


def metrics_app(kind: str, text: str) -> web.Application:
    """One kind's /metrics (with a Content-Length); vLLM's also answers `name[]` selections at /metrics/ as
    its prometheus-client app does under uvicorn: chunked, and gzipped when the client accepts gzip."""
    body = text.encode()
    selections: dict[tuple[tuple[str, ...], bool], bytes] = {}

    async def whole(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    async def selected(request: web.Request) -> web.StreamResponse:
        names = tuple(request.query.getall("name[]", ()))
        gzipped = "gzip" in request.headers.get("Accept-Encoding", "")
        if (names, gzipped) not in selections:
            answer = selected_text(text, names).encode()
            selections[names, gzipped] = gzip.compress(answer) if gzipped else answer
        response = web.StreamResponse(headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
        if gzipped:
            response.headers["Content-Encoding"] = "gzip"
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(selections[names, gzipped])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/metrics", whole)
    if kind == "vllm":
        app.router.add_get("/metrics/", selected)
    return app


async def serve(engines: int, kinds: Sequence[str]) -> None:
    """`engines` endpoints per kind; prints their URLs as one JSON line, serves until stdin closes."""
    texts = await engine_texts()
    urls: dict[str, list[str]] = {}
    runners = []
    for kind in kinds:
        runner = web.AppRunner(metrics_app(kind, texts[kind]), access_log=None)
        await runner.setup()
        runners.append(runner)
        for _ in range(engines):
            await web.TCPSite(runner, "127.0.0.1", 0).start()
        urls[kind] = [f"http://127.0.0.1:{address[1]}" for address in runner.addresses]
    print(json.dumps(urls), flush=True)
    try:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    finally:
        for runner in runners:
            await runner.cleanup()


# --- the measuring side -----------------------------------------------------------------------------------------


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
    return config_from_dict(
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


# --- report -----------------------------------------------------------------------------------------------------


def report(
    windows: list[Window], costs: dict[str, dict[str, float]], texts: dict[str, str], args: argparse.Namespace
) -> bool:
    """Print the tables; True when the shipped design meets the target for every kind."""
    kinds = list(dict.fromkeys(w.kind for w in windows))
    print(
        f"\n{args.engines} engines per kind, each read every {args.interval} s (the shipped "
        f"scrape_interval_seconds: {shipped('scrape_interval_seconds', BackendConfig)}), event loop {args.loop}, "
        f"{args.rounds} rounds of {args.seconds} s; median [worst] over rounds\n"
    )
    print("parse alone (us of CPU per parse of the text the adapter reads):")
    for kind in kinds:
        old, new = costs[kind]["prometheus-client"], costs[kind]["scan"]
        size = len(text_read(kind, texts).encode()) / 1000
        print(
            f"  {kind:10s} {size:5.1f} KB  prometheus-client {old:7.1f}  scan {new:6.1f}  scan/before {new / old:.2f}x"
        )
    print("\nwhole scrape in the running scheduler (HTTP GET + parse + BackendLoad + monitor, all CPU / scrapes):")
    header = f"  {'kind':10s} {'way':26s} {'us/scrape':>16s} {'share of a core':>18s} {'scrapes/s':>9s}"
    print(header + f" {'loop lag p99':>12s} {'worst':>8s}")
    for kind in kinds:
        for variant in VARIANTS:
            rows = [w for w in windows if w.kind == kind and w.variant == variant]
            if not rows:
                continue
            cost = [w.cpu_per_scrape_us for w in rows]
            share = [w.share_at_interval for w in rows]
            failing = max(w.failing_engines for w in rows)
            print(
                f"  {kind:10s} {variant.label:26s} {statistics.median(cost):6.0f} [{max(cost):6.0f}]"
                f"   {100 * statistics.median(share):5.1f}% [{100 * max(share):5.1f}%]"
                f" {statistics.median(w.scrapes_per_second for w in rows):9.0f}"
                f" {statistics.median(w.lag_p99_ms for w in rows):9.1f} ms {max(w.lag_max_ms for w in rows):5.1f} ms"
                + (f"  ({failing} engines failing!)" if failing else "")
            )
    print("\nside by side, ratios within each round (median [worst] over rounds):")
    for kind in kinds:
        by_round = _by_round(windows, kind)
        parts = [
            f"{other.label.removeprefix('shipped, ')} {_ratio(by_round, other)}"
            for other in (PARSE_BEFORE, CLIENT_BEFORE, AT_ONCE)
        ]
        lag = [r[AT_ONCE].lag_p99_ms / max(r[SHIPPED].lag_p99_ms, 1e-3) for r in by_round]
        print(
            f"  {kind:10s} CPU per scrape, shipped / before {_ratio(by_round, BEFORE)}; shipped / "
            + "; ".join(parts)
            + f"; loop lag p99, one beat for all / shipped {statistics.median(lag):.1f}x [{min(lag):.1f}x]"
        )
    worst = {
        kind: max(w.share_at_interval for w in windows if w.kind == kind and w.variant == SHIPPED) for kind in kinds
    }
    counted = [kind for kind in kinds if kind in TARGET_KINDS]
    met = all(worst[kind] <= TARGET_SHARE for kind in counted)
    print(
        f"\ntarget: {args.engines} engines at {args.interval} s take at most {TARGET_SHARE:.0%} of a core, each "
        f"adapter reading its engine as shipped ({', '.join(counted)}): {'met' if met else 'MISSED'}; worst window: "
        + ", ".join(f"{kind} {100 * share:.1f}%" for kind, share in worst.items())
    )
    if "vllm_whole" in worst:
        print("  (vllm_whole is the fallback for a vLLM that does not select: 55 KB a scrape, not counted)")
    return met


def _ratio(by_round: list[dict[Variant, Window]], other: Variant) -> str:
    ratios = [r[SHIPPED].cpu_per_scrape_us / r[other].cpu_per_scrape_us for r in by_round]
    return f"{statistics.median(ratios):.2f}x [{max(ratios):.2f}x]"


def _by_round(windows: list[Window], kind: str) -> list[dict[Variant, Window]]:
    rows = [w for w in windows if w.kind == kind]
    per = len(VARIANTS)
    return [{w.variant: w for w in rows[i : i + per]} for i in range(0, len(rows), per)]


async def run(args: argparse.Namespace, urls: dict[str, list[str]]) -> list[Window]:
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", type=int, default=100)
    parser.add_argument("--interval", type=float, default=shipped("scrape_interval_seconds", BackendConfig))
    parser.add_argument("--seconds", type=float, default=4.0, help="measuring window per way of reading")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--loop", choices=EVENT_LOOPS, default=shipped("event_loop", ServerConfig))
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the child's part
    args = parser.parse_args(argv)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not set(args.kinds) <= set(KINDS) or not 1 <= args.engines <= 1000 or args.interval <= 0:
        parser.error(f"--kinds among {','.join(KINDS)}, --engines 1-1000, --interval > 0")
    if args.serve:
        run_on(args.loop, lambda: serve(args.engines, args.kinds))
        return 0
    configure_logging("warning")  # not a line per engine as each first answers
    serving = ["--serve", "--engines", str(args.engines), "--kinds", ",".join(args.kinds), "--loop", args.loop]
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.scrape_scale", *serving],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        assert child.stdout is not None
        urls = json.loads(child.stdout.readline())
        texts: dict[str, str] = run_on(args.loop, engine_texts)
        costs = parse_costs(texts, args.kinds)
        windows: list[Window] = run_on(args.loop, lambda: run(args, urls))
    finally:
        _stop(child)
    return 0 if report(windows, costs, texts, args) else 1


def _stop(child: subprocess.Popen[bytes]) -> None:
    if child.stdin is not None:
        child.stdin.close()
    try:
        child.wait(10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


if __name__ == "__main__":
    raise SystemExit(main())

"""S6 overhead: what the scheduler itself costs, measured against an engine that answers instantly.

The engine (`bench.fake_engine`) streams 16 tokens at once, so the difference between a request sent
through the scheduler and one sent straight to the engine is the scheduler's own latency. Three phases per
run: a low fixed request rate and the target rate (open loop: requests leave on schedule whether or not
earlier ones finished) for the added-latency percentiles, then a closed loop of many concurrent clients
for the ceiling. The scheduler's CPU time per request comes from /proc, so it does not depend on the load
generator's speed. Against the real vLLM (`--engine vllm`) the same runs use rates a CPU engine can take.

The scheduler runs twice per round, once with its clients on the gRPC door and once on the OpenAI-compatible
HTTP door (`POST /v1/completions`, SSE): both subtract the same engine-alone run of the round, so each door's
added latency is the scheduler's work plus what its hop costs over the direct HTTP request to the engine. The
HTTP run skips the ceiling (the door's latency is what it measures; the ceiling is the scheduler's).

With `--profile`, one more scheduled run at the fixed rate runs the scheduler under pyinstrument and
writes the call tree and a summary of own time by area and function (`bench.profile_summary`) next to the
results.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import harness
from bench.configs import scheduler_config
from bench.engines import Engine, EngineProvider
from bench.profile_summary import summarize
from bench.records import percentile
from bench.results import ScenarioResult, Table, Target
from bench.runner import SCHEDULED_MODEL, Mode, RunContext
from bench.scenarios._common import STANDARD_CLASS, divide, jsonable, ms, not_run, number, run_modes
from bench.scenarios.definition import Definition

TITLE = "overhead"
DIRECT = "engine alone"
ECHO = "bare gRPC echo"
SCHEDULED = "scheduler, round_robin"
HTTP = "scheduler through HTTP, round_robin"
HTTP_RATIO = 1.5  # target: added latency p50 through the HTTP door at most 1.5x the gRPC door's
PROFILED = "scheduler under pyinstrument"


@dataclass(frozen=True)
class S6Params:
    tokens: int = 16
    rate: float = 300.0
    low_rate: float = 50.0
    warmup: float = 1.0
    duration: float = 5.0
    ceiling_concurrency: int = 64
    ceiling_duration: float = 4.0
    timeout: float = 60.0
    rounds: int = 3  # each round runs every mode once, in turn: the medians compare interleaved runs


VLLM_PARAMS = S6Params(
    rate=8.0,
    low_rate=2.0,
    warmup=2.0,
    duration=10.0,
    ceiling_concurrency=8,
    ceiling_duration=8.0,
    timeout=120.0,
    rounds=1,
)


class FakeProvider:
    """`bench.fake_engine` subprocesses: an engine with no decode time at all."""

    name = "fake"

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    def describe(self) -> str:
        return f"instant fake engine (bench/fake_engine.py): {self.tokens} tokens streamed at once, no queue"

    @contextlib.asynccontextmanager
    async def engine(self, scheduling_policy: str = "fcfs") -> AsyncIterator[Engine]:
        async with harness.fake_engine(self.tokens) as url:
            yield Engine(url, "fake-model", scheduling_policy)

    async def aclose(self) -> None:
        return None


def config(engine: Engine) -> Any:
    return scheduler_config(
        engine_url=engine.url,
        model=SCHEDULED_MODEL,
        engine_model=engine.model,
        classes=STANDARD_CLASS,
        waiting_target=3,
    )


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
    cpu = _minus(run.scheduler_cpu_seconds(), cpu0)
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
    cpu = _minus(run.scheduler_cpu_seconds(), cpu0)
    stop.set()
    await run.wait_all(p.timeout)
    done = [r for r in run.records if r.tag == "ceiling" and r.completed and r.finished and c0 <= r.finished < c1]
    return {
        "rate": len(done) / (c1 - c0),
        "scheduler_cpu_per_request": divide(cpu, len(done)),
        "scheduler_cpu_share": divide(cpu, c1 - c0),
    }


async def _body(run: RunContext, p: S6Params) -> dict[str, Any]:
    await fixed_rate(run, p, p.low_rate, p.warmup, "warmup")
    await run.wait_all(p.timeout)
    low = await phase(run, p, p.low_rate, "low")
    target = await phase(run, p, p.rate, "target")
    if run.mode.echo or run.mode.http:  # the echo and the HTTP door: the latency phases only
        return {"low": low, "target": target, "errors": _errors(run)}
    ceiling = await _ceiling(run, p)
    return {"low": low, "target": target, "ceiling": ceiling, "errors": _errors(run)}


def _errors(run: RunContext) -> list[str]:
    return sorted({r.error for r in run.records if r.error and r.error != "cancelled"})


async def _profile(provider: EngineProvider, p: S6Params, out_dir: Path) -> list[str]:
    """One more fixed-rate run with the scheduler under pyinstrument; returns the files written."""
    session = out_dir / "s6_profile.pyisession"
    wrapper = [sys.executable, "-m", "pyinstrument", "-r", "pyisession", "-o", str(session)]
    profiled = [Mode(PROFILED, config=config)]

    async def body(run: RunContext) -> None:
        await fixed_rate(run, p, p.rate, min(p.duration, 3.0), "profile")  # profiled, it saturates sooner
        await run.wait_all(p.timeout)

    await run_modes(provider, profiled, body, timeout=p.duration + p.timeout, scheduler_wrapper=wrapper)
    tree = out_dir / "s6_profile.txt"
    command = [sys.executable, "-m", "pyinstrument", f"--load={session}", "-r", "text", "--no-color"]
    rendered = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=120)
    tree.write_text(rendered.stdout)
    summary = out_dir / "s6_profile_summary.txt"
    summary.write_text(await asyncio.to_thread(summarize, session))
    written = [tree.name, summary.name, session.name]
    return written


async def run(
    provider: EngineProvider, p: S6Params | None = None, *, profile: bool = False, out_dir: Path | None = None
) -> list[ScenarioResult]:
    real_engine = provider.name == "vllm"
    p = p or (VLLM_PARAMS if real_engine else S6Params())
    engines: EngineProvider = provider if real_engine else FakeProvider(p.tokens)
    workload = (
        f"{p.tokens}-token requests at a fixed {p.low_rate:g} and then {p.rate:g} requests/s, {p.duration:g} s "
        f"each (after {p.warmup:g} s of warm-up), then {p.ceiling_concurrency} clients back to back for "
        f"{p.ceiling_duration:g} s (the ceiling); {p.rounds} round(s), each running the engine alone, a bare gRPC "
        "echo, the scheduler by gRPC and the scheduler by its HTTP door (no ceiling) in turn"
    )
    modes = [
        Mode(DIRECT),
        Mode(ECHO, echo=True),
        Mode(SCHEDULED, config=config),
        Mode(HTTP, config=config, http=True),
    ]
    timeout = 3 * p.duration + 4 * p.timeout
    rounds: list[dict[str, dict[str, Any]]] = []
    skipped: dict[str, str] = {}
    for i in range(p.rounds):
        print(f"  round {i + 1} of {p.rounds}", flush=True)
        runs, missed = await run_modes(engines, modes, lambda r: _body(r, p), timeout=timeout)
        skipped.update(missed)
        if all(label in runs for label in (DIRECT, ECHO, SCHEDULED)):
            rounds.append(runs)
    if not rounds:
        return [ScenarioResult.unavailable("S6", TITLE, workload, "; ".join(not_run(skipped)) or "a run failed")]
    result = ScenarioResult("S6", TITLE, workload, engines.describe(), notes=not_run(skipped))
    result.table = Table(["run", "rate (sent / offered)", "latency p50", "latency p99", "TTFT p50", "TTFT p99"])
    figures = ("latency_p50", "latency_p99", "ttft_p50", "ttft_p99")
    with_http = [r for r in rounds if HTTP in r]
    for phase in ("low", "target"):
        for label in (DIRECT, ECHO, SCHEDULED, HTTP):
            xs = [r[label][phase] for r in rounds if label in r]
            if not xs:
                continue
            sent = _median([x["sent_rate"] for x in xs])
            result.table.rows.append(
                [label, f"{number(sent)} / {xs[0]['offered_rate']:g} req/s", *(_spread(xs, f) for f in figures)]
            )
        added = [{f: _minus(r[SCHEDULED][phase][f], r[DIRECT][phase][f]) for f in figures} for r in rounds]
        offered = rounds[0][DIRECT][phase]["offered_rate"]
        result.table.rows.append(
            [f"**added by the scheduler** at {offered:g} req/s", "", *(_spread(added, f) for f in figures)]
        )
        if with_http:
            added_http = [{f: _minus(r[HTTP][phase][f], r[DIRECT][phase][f]) for f in figures} for r in with_http]
            result.table.rows.append(
                [
                    f"**added through the HTTP door** at {offered:g} req/s",
                    "",
                    *(_spread(added_http, f) for f in figures),
                ]
            )
        echo = [{f: _times(2.0, r[ECHO][phase][f]) for f in figures} for r in rounds]
        result.table.rows.append(
            [f"2x the echo's round trip at {offered:g} req/s", "", *(_spread(echo, f) for f in figures)]
        )
    added_p50 = _median(
        [_minus(r[SCHEDULED]["target"]["latency_p50"], r[DIRECT]["target"]["latency_p50"]) for r in rounds]
    )
    added_p99 = _median(
        [_minus(r[SCHEDULED]["target"]["latency_p99"], r[DIRECT]["target"]["latency_p99"]) for r in rounds]
    )
    echo_p50 = _median([r[ECHO]["target"]["latency_p50"] for r in rounds])
    # "< 1 ms, or at most 2x a bare gRPC echo's round trip in the same run": whichever bound is looser
    bound = max(0.001, 2.0 * echo_p50) if echo_p50 is not None else 0.001
    rate = f"at {p.rate:g} requests/s"
    result.targets += [
        Target(
            "added latency p50",
            f"< 1 ms or at most 2x the bare gRPC echo's round trip (here {ms(bound)}) {rate}",
            SCHEDULED,
            added_p50,
            bound,
            1.5 * bound,
            False,
            " s",
        ),
        Target("added latency p99", f"< 5 ms {rate}", SCHEDULED, added_p99, 0.005, 0.0075, False, " s"),
    ]
    result.notes.append(
        f"Figures are medians over {len(rounds)} interleaved round(s), [min - max] beside them; the added latency is "
        "taken per round (scheduler minus engine alone of the same round), then its median. The echo "
        "(bench/grpc_echo.py) is a separate grpc.aio process that answers the same client with the same four "
        "messages at once: the cost of one gRPC streaming hop on this machine."
    )
    if with_http:
        _http_door(result, with_http, p)
    ceilings = [r[SCHEDULED]["ceiling"] for r in rounds]
    ceiling_rate = _median([c["rate"] for c in ceilings])
    cpu_share = _median([c["scheduler_cpu_share"] for c in ceilings])
    cpu_per_request = _median([c["scheduler_cpu_per_request"] for c in ceilings])
    direct_rate = _median([r[DIRECT]["ceiling"]["rate"] for r in rounds])
    result.notes.append(
        f"Ceiling ({p.ceiling_concurrency} clients back to back): {number(ceiling_rate)} req/s through the "
        f"scheduler, {number(direct_rate)} req/s straight to the engine; the scheduler then used "
        f"{cpu_share or 0:.0%} of a core, {ms(cpu_per_request)} of CPU per request (so about "
        f"{number(divide(1.0, cpu_per_request))} req/s if it had a core to itself). Measured on 2 cores shared "
        "with the load generator, the engine and other users."
    )
    low_cpu = _median([r[SCHEDULED]["low"]["scheduler_cpu_per_request"] for r in rounds])
    target_cpu = _median([r[SCHEDULED]["target"]["scheduler_cpu_per_request"] for r in rounds])
    echo_cpu = _median([r[ECHO]["target"]["scheduler_cpu_per_request"] for r in rounds])
    result.notes.append(
        f"Scheduler CPU per request: {ms(low_cpu)} at {p.low_rate:g} req/s, {ms(target_cpu)} at {p.rate:g} req/s; "
        f"the bare gRPC echo's at {p.rate:g} req/s: {ms(echo_cpu)} (the gRPC hop alone; the scheduler adds the HTTP "
        "client to the engine and its own work). Once CPU per request times the rate nears the core the scheduler "
        "gets, requests queue for the CPU and the added latency grows from milliseconds to hundreds of them."
    )
    if profile and out_dir is not None:
        result.files += await _profile(engines, p, out_dir)
        result.notes.append(
            "Profile of the scheduler at the fixed rate: s6_profile_summary.txt (own time by area and function), "
            "s6_profile.txt (call tree)."
        )
    result.raw = {"rounds": [{label: jsonable(r) for label, r in runs.items()} for runs in rounds]}
    return [result]


def added_ratio(rounds: list[dict[str, dict[str, Any]]], phase: str, door: str) -> tuple[float | None, ...]:
    """(median added latency p50 through `door`, through gRPC, their ratio) over the rounds that ran both;
    added = that door's p50 minus the engine alone's p50 of the same round. No ratio when gRPC's added
    latency is not positive (noise would make any ratio meaningless)."""
    both = [r for r in rounds if door in r and SCHEDULED in r and DIRECT in r]
    door_added = _median([_minus(r[door][phase]["latency_p50"], r[DIRECT][phase]["latency_p50"]) for r in both])
    grpc_added = _median([_minus(r[SCHEDULED][phase]["latency_p50"], r[DIRECT][phase]["latency_p50"]) for r in both])
    ratio = divide(door_added, grpc_added) if grpc_added is not None and grpc_added > 0 else None
    return door_added, grpc_added, ratio


def _http_door(result: ScenarioResult, rounds: list[dict[str, dict[str, Any]]], p: S6Params) -> None:
    """The HTTP door's target and notes: its added latency against the gRPC door's, same rounds."""
    http_added, grpc_added, ratio = added_ratio(rounds, "target", HTTP)
    low_http, low_grpc, low_ratio = added_ratio(rounds, "low", HTTP)
    result.targets.append(
        Target(
            "added latency p50, HTTP door ÷ gRPC door",
            f"<= {HTTP_RATIO:g}x the gRPC door's at {p.rate:g} requests/s (same rounds)",
            HTTP,
            ratio,
            HTTP_RATIO,
            2.0,
            False,
            "x",
        )
    )
    http_cpu = _median([r[HTTP]["target"]["scheduler_cpu_per_request"] for r in rounds])
    grpc_cpu = _median([r[SCHEDULED]["target"]["scheduler_cpu_per_request"] for r in rounds])
    low_text = "-" if low_ratio is None else f"{low_ratio:.2f}x"
    result.notes.append(
        f"HTTP door ({len(rounds)} round(s)): added latency p50 {ms(http_added)} against gRPC's {ms(grpc_added)} "
        f"at {p.rate:g} req/s, {ms(low_http)} against {ms(low_grpc)} ({low_text}) at {p.low_rate:g} req/s; each is "
        "the door's latency p50 minus the engine alone's of the same round (the same method for both doors: the "
        "engine-alone request is itself an HTTP/SSE request from the same aiohttp client, so the HTTP door's "
        "figure is the scheduler's work plus one more HTTP hop, gRPC's the scheduler's work plus a gRPC hop in "
        f"place of an HTTP one). Scheduler CPU per request at {p.rate:g} req/s: {ms(http_cpu)} by HTTP, "
        f"{ms(grpc_cpu)} by gRPC."
    )


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _spread(rows: list[dict[str, Any]], figure: str) -> str:
    """The median of a figure over the rounds, with its range when there is more than one round."""
    values = [v for v in (row[figure] for row in rows) if v is not None]
    if len(values) < 2:
        return ms(_median(values))
    return f"{ms(_median(values))} [{ms(min(values))} - {ms(max(values))}]"


def _times(factor: float, value: float | None) -> float | None:
    return None if value is None else factor * value


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


_P = S6Params()
DEFINITION = Definition(
    id="S6",
    title=TITLE,
    question="What does the scheduler itself add to a request's latency, and how many requests a second can it take?",
    workload=f"open loops at {_P.low_rate:g} and {_P.rate:g} requests/s for {_P.duration:g} s each (after a "
    f"{_P.warmup:g} s warm-up), {_P.tokens} tokens an answer; then {_P.ceiling_concurrency} clients back to back "
    f"for {_P.ceiling_duration:g} s (the ceiling); {_P.rounds} interleaved rounds",
    layout="an engine that answers at once (`bench.fake_engine`); in every round the engine alone, the "
    "scheduler by its gRPC door and by its HTTP door, and a bare grpc.aio streaming echo "
    "(`bench/grpc_echo.py`: the cost of one gRPC hop on the machine)",
    measures="added latency p50 and p99 (the scheduler's run minus the engine alone's, per round, then the "
    "median), the scheduler's CPU per request (from /proc), the ceiling",
    targets=(
        f"added latency p50 < 1 ms, or at most 2x the echo's round trip, at {_P.rate:g} requests/s",
        f"added latency p99 < 5 ms at {_P.rate:g} requests/s",
        f"the HTTP door's added p50 at most {HTTP_RATIO:g}x the gRPC door's",
    ),
    command="python -m bench --scenarios S6",
    duration="about 3 minutes; --profile also profiles the scheduler at the fixed rate",
    facts=(
        "The scheduler costs a few milliseconds of CPU per request in Python, most of it in gRPC aio, aiohttp "
        "and the event loop; the gRPC hop alone (the echo) is about half of it.",
        "Once CPU per request times the rate nears the core the scheduler gets, requests queue for the CPU and "
        "the added latency grows from milliseconds to hundreds of them: on a loaded 2-core machine 300 "
        "requests/s is near that point.",
        "Dispatching inline at admission, instead of in the model's dispatch loop, hands freed slots to "
        "whoever arrives first and costs S3 its weight shares.",
    ),
    headline=("added latency p50",),
)

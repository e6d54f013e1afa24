"""S6 overhead: what the scheduler itself costs, measured against an engine that answers instantly.

The engine (`bench.servers.fake_engine`) streams 16 tokens at once, so the difference between a request sent
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
writes the call tree and a summary of own time by area and function (`bench.scenarios.s6.profile`) next to the
results.
"""

from __future__ import annotations

from typing import Any

from bench.engines import EngineProvider
from bench.results import ScenarioResult
from bench.runner import run_modes
from bench.scenario import Definition, Options, Scenario
from bench.scenarios.common import not_run
from bench.scenarios.s6.profile import profiled
from bench.scenarios.s6.setups import (
    DIRECT,
    ECHO,
    HTTP_RATIO,
    SCHEDULED,
    TITLE,
    VLLM_PARAMS,
    FakeProvider,
    S6Params,
    modes,
)
from bench.scenarios.s6.summary import summarise
from bench.scenarios.s6.workload import body


async def run(
    provider: EngineProvider, options: Options | None = None, p: S6Params | None = None
) -> list[ScenarioResult]:
    """S6's rounds (every mode once a round, in turn), then, with `--profile`, the scheduler under a profiler."""
    real_engine = provider.name == "vllm"
    p = p or (VLLM_PARAMS if real_engine else S6Params())
    engines: EngineProvider = provider if real_engine else FakeProvider(p.tokens)
    workload = (
        f"{p.tokens}-token requests at a fixed {p.low_rate:g} and then {p.rate:g} requests/s, {p.duration:g} s "
        f"each (after {p.warmup:g} s of warm-up), then {p.ceiling_concurrency} clients back to back for "
        f"{p.ceiling_duration:g} s (the ceiling); {p.rounds} round(s), each running the engine alone, a bare gRPC "
        "echo, the scheduler by gRPC and the scheduler by its HTTP door (no ceiling) in turn"
    )
    timeout = 3 * p.duration + 4 * p.timeout
    rounds: list[dict[str, dict[str, Any]]] = []
    skipped: dict[str, str] = {}
    for i in range(p.rounds):
        print(f"  round {i + 1} of {p.rounds}", flush=True)
        runs, missed = await run_modes(engines, modes(), lambda r: body(r, p), timeout=timeout)
        skipped.update(missed)
        if all(label in runs for label in (DIRECT, ECHO, SCHEDULED)):
            rounds.append(runs)
    if not rounds:
        return [ScenarioResult.unavailable("S6", TITLE, workload, "; ".join(not_run(skipped)) or "a run failed")]
    result = summarise(rounds, skipped, p, workload, engines.describe())
    if options is not None and options.profile:
        result.files += await profiled(engines, p, options.out_dir)
        result.notes.append(
            "Profile of the scheduler at the fixed rate: s6_profile_summary.txt (own time by area and function), "
            "s6_profile.txt (call tree)."
        )
    return [result]


_P = S6Params()
DEFINITION = Definition(
    id="S6",
    title=TITLE,
    question="What does the scheduler itself add to a request's latency, and how many requests a second can it take?",
    workload=f"open loops at {_P.low_rate:g} and {_P.rate:g} requests/s for {_P.duration:g} s each (after a "
    f"{_P.warmup:g} s warm-up), {_P.tokens} tokens an answer; then {_P.ceiling_concurrency} clients back to back "
    f"for {_P.ceiling_duration:g} s (the ceiling); {_P.rounds} interleaved rounds",
    layout="an engine that answers at once (`bench.servers.fake_engine`); in every round the engine alone, the "
    "scheduler by its gRPC door and by its HTTP door, and a bare grpc.aio streaming echo "
    "(`bench/servers/grpc_echo.py`: the cost of one gRPC hop on the machine)",
    measures="added latency p50 and p99 (the scheduler's run minus the engine alone's, per round, then the "
    "median), the scheduler's CPU per request (from /proc), the ceiling",
    targets=(
        f"added latency p50 < 1 ms, or at most 2x the echo's round trip, at {_P.rate:g} requests/s",
        f"added latency p99 < 5 ms at {_P.rate:g} requests/s",
        f"the HTTP door's added p50 at most {HTTP_RATIO:g}x the gRPC door's",
    ),
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
SCENARIO = Scenario((DEFINITION,), run, engines=("sim", "vllm"))

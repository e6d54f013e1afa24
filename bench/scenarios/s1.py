"""S1 flood + latecomers, and S2 utilisation over the same runs.

User A submits a flood of requests at once (about 200 output tokens each, lengths spread so slots free up
at different times, as real answers do); users B and C each send one a little later. Measured: B's and
C's time to first token (S1) and the engine's output tokens/s over a fixed window of the flood (S2).

"A little later" is once the flood's first requests have started to finish. Engines do not preempt a
running request to admit another, so a latecomer who arrives while the first wave still holds every batch
slot waits for the first slot to free, through the scheduler as with the engine's own priority queue;
the S1 bound's "+ one request's decode time" is that wait.

Runs: the engine alone (its FIFO; its priority policy with the latecomers sending `priority: -1`), then
llm-scheduler in front of the FIFO engine with each fairness policy the service offers. The headline setup
(round_robin in front of the priority engine) runs twice in a row, by the gRPC door and by the
OpenAI-compatible HTTP door, so the two doors' latecomer TTFTs compare within one run.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass
from typing import Any

from bench.configs import STANDARD_CLASS, for_engine
from bench.engines import Engine, EngineProvider
from bench.results import ScenarioResult, Table, Target
from bench.runner import ConfigBuilder, Mode, RunContext, run_modes
from bench.scenario import Definition, Options, Plot, Scenario
from bench.scenarios.common import (
    divide,
    errors,
    not_run,
    number,
    ratio,
    seconds,
    share,
    ttft_series,
    with_requests,
)
from bench.scenarios.workloads import decode_median, flood, idle_probe

POLICIES = ("round_robin", "weighted_round_robin", "vtc")
GATE_TARGET = 3
DIRECT_FIFO = "engine alone (FIFO)"
DIRECT_PRIORITY = "engine alone (priority, latecomers -1)"
HEADLINE = "scheduler, round_robin + engine priorities"
HEADLINE_HTTP = "scheduler through HTTP, round_robin + engine priorities"
HTTP_RATIO = 1.1  # target: the HTTP door's latecomer median at most 1.1x the gRPC door's
FIFO_RATIO = "latecomer TTFT, engine FIFO ÷ scheduler"
DOOR_RATIO = "latecomer median TTFT, HTTP door ÷ gRPC door"
S2_FIGURE = "engine output tokens/s, scheduler ÷ engine FIFO"


@dataclass(frozen=True)
class S1Params:
    flood: int = 200  # requests user A sends at once
    tokens_min: int = 100  # each flood answer's length is drawn from tokens_min-tokens_max (seeded)
    tokens_max: int = 300
    latecomer_tokens: int = 200  # B's and C's answers
    latecomer_delay: float = 5.0  # seconds into the flood when B and C send
    window_start: float = 2.0  # S2's throughput window: from this many seconds into the flood ...
    window: float = 8.0  # ... for this long
    probe_tokens: int = 16  # the idle engine's probe request
    timeout: float = 120.0  # for the latecomers' first tokens
    seed: int = 1  # of the flood's answer lengths: the same in every run


# The tiny CPU vLLM makes ~600 tokens/s with 4 slots: this flood keeps it busy for about 20 s.
VLLM_PARAMS = S1Params(
    flood=120,
    tokens_min=50,
    tokens_max=150,
    latecomer_tokens=100,
    latecomer_delay=3.0,
    window_start=1.0,
    window=6.0,
    timeout=300.0,
)


def config(policy: str, priority_scheduling: bool = False) -> ConfigBuilder:
    """The scheduler with fairness `policy`, one class, the gate's waiting target; optionally sending its
    own priorities to a priority-scheduled engine."""

    def build(engine: Engine) -> dict[str, Any]:
        settings = {
            "classes": STANDARD_CLASS,
            "waiting_target": GATE_TARGET,
            "priority_scheduling": priority_scheduling,
        }
        return for_engine(engine, fairness=policy, **settings)

    return build


def modes(policies: tuple[str, ...] = POLICIES) -> list[Mode]:
    # The priority engine runs first, so a real engine is started once per policy and the FIFO one stays up
    # for the scheduled runs (and S6) afterwards.
    return [
        Mode(DIRECT_PRIORITY, engine_policy="priority"),
        # the scheduler on the same priority-scheduled engine, sending its own priorities (no client help),
        # by each door in turn
        Mode(HEADLINE, engine_policy="priority", config=config("round_robin", True)),
        Mode(HEADLINE_HTTP, engine_policy="priority", config=config("round_robin", True), http=True),
        Mode(DIRECT_FIFO),
        *(Mode(f"scheduler, {policy}", config=config(policy)) for policy in policies),
    ]


async def body(run: RunContext, p: S1Params) -> dict[str, Any]:
    late_priority = -1 if run.mode.engine_policy == "priority" and not run.mode.scheduled else None
    idle = await idle_probe(run, p.probe_tokens)
    flood(run, p.flood, p.tokens_min, p.tokens_max, p.seed)
    await asyncio.sleep(p.window_start)  # S2's window starts once the flood is in the engine
    t0, tokens0 = await run.probe.generated_tokens()
    await asyncio.sleep(max(0.0, p.latecomer_delay - run.clock.now()))  # latecomers come a little later
    late = [
        run.send(user, "latecomer", p.latecomer_tokens, f"User {user} asks a question.", engine_priority=late_priority)
        for user in ("B", "C")
    ]
    await asyncio.sleep(max(0.0, p.window_start + p.window - run.clock.now()))  # a fixed throughput window
    t1, tokens1 = await run.probe.generated_tokens()
    await run.until(lambda: all(r.first_token is not None or r.error for r in late), p.timeout)
    return {
        "idle_ttft": idle.ttft,
        "latecomer_ttft": {r.user: r.ttft for r in late},
        "tokens_per_second": (tokens1 - tokens0) / (t1 - t0),
        "mean_batch": run.probe.mean_running(t0, t1),
        "window": [t0, t1],
        "request_decode_seconds": decode_median(run.records),
        "flood_completed": sum(1 for r in run.records if r.tag == "flood" and r.completed),
        "errors": errors(run.records),
        "_records": list(run.records),
        "_engine": [(s.t, s.waiting, s.running) for s in run.probe.samples],
    }


def _worst(run: dict[str, Any]) -> float | None:
    values = list(run["latecomer_ttft"].values())
    return None if any(v is None for v in values) else max(values)


def latecomer_median(run: dict[str, Any]) -> float | None:
    """The median latecomer TTFT of a run; None if a latecomer got no token (a median would hide that)."""
    values = list(run["latecomer_ttft"].values())
    return None if not values or any(v is None for v in values) else statistics.median(values)


async def run(
    provider: EngineProvider, options: Options | None = None, p: S1Params | None = None
) -> list[ScenarioResult]:
    """Both S1 and S2 from the same runs."""
    p = p or (VLLM_PARAMS if provider.name == "vllm" else S1Params())
    workload = (
        f"user A floods {p.flood} requests at once ({p.tokens_min}-{p.tokens_max} output tokens each, "
        f"mean {(p.tokens_min + p.tokens_max) // 2}); users B and C send one each ({p.latecomer_tokens} tokens) "
        f"{p.latecomer_delay:g} s later"
    )
    runs, skipped = await run_modes(provider, modes(), lambda r: body(r, p), timeout=p.timeout + 60)
    s1 = ScenarioResult("S1", "flood + latecomers", workload, provider.describe(), notes=not_run(skipped))
    s2 = ScenarioResult(
        "S2",
        "utilisation",
        f"same runs as S1; engine output tokens/s from {p.window_start:g} s to "
        f"{p.window_start + p.window:g} s into the flood",
        provider.describe(),
        notes=not_run(skipped),
    )
    direct = runs.get(DIRECT_FIFO)
    if direct is None:
        reason = skipped.get(DIRECT_FIFO, "the direct run failed")
        return [
            ScenarioResult.unavailable("S1", s1.title, workload, reason),
            ScenarioResult.unavailable("S2", s2.title, s2.workload, reason),
        ]
    direct_worst = _worst(direct)
    s1.table = Table(["run", "idle-engine TTFT", "TTFT B", "TTFT C", "engine FIFO ÷ run (worst)"])
    s2.table = Table(["run", "engine output tokens/s", "run ÷ engine FIFO", "mean batch (of max_num_seqs)"])
    ordered = sorted(runs.items(), key=lambda item: (item[0] != DIRECT_FIFO, item[0] != DIRECT_PRIORITY))
    for label, result in ordered:
        ttft = result["latecomer_ttft"]
        s1.table.rows.append(
            [
                label,
                seconds(result["idle_ttft"]),
                seconds(ttft.get("B")),
                seconds(ttft.get("C")),
                ratio(divide(direct_worst, _worst(result))),
            ]
        )
        tps = result["tokens_per_second"]
        s2.table.rows.append(
            [label, number(tps), share(divide(tps, direct["tokens_per_second"])), number(result["mean_batch"], 1)]
        )
        if label.startswith("scheduler"):
            _targets(s1, s2, label, result, direct)
    _door_target(s1, runs)
    s1.notes.append(
        "One request's decode time in the S1 bound is the median first-to-last-token time of the flood's "
        "requests in the engine-alone FIFO run (it serves most of the flood at a full batch)."
    )
    s2.notes.append(
        "Tokens/s is wall-clock and slows with the machine's load; the mean batch (the engine's running gauge, "
        "sampled every 0.1 s) shows whether the scheduler kept the engine full regardless of that."
    )
    s1.raw = s2.raw = {label: with_requests(result) for label, result in ordered}
    s1.series = ttft_series(dict(ordered), GATE_TARGET)
    return [s1, s2]


def _targets(s1: ScenarioResult, s2: ScenarioResult, label: str, run: dict[str, Any], direct: dict[str, Any]) -> None:
    s1.targets += latecomer_targets(label, _worst(run), run, direct, _worst(direct), "")
    tps = divide(run["tokens_per_second"], direct["tokens_per_second"])
    s2.targets.append(Target.at_least(S2_FIGURE, ">= 95% of direct", label, tps, 0.95, 0.92, "%"))


def latecomer_targets(
    label: str, worst: float | None, run: dict[str, Any], direct: dict[str, Any], direct_worst: float | None, how: str
) -> list[Target]:
    """S1's targets for a run (C1's too, `how` naming its "(worst)"): its worst latecomer within twice the
    idle engine's time to first token plus one request's decode time, and >= 10x better than the engine's
    FIFO. The decode time is the engine-alone run's (it serves most of the flood at a full batch)."""
    decode = direct["request_decode_seconds"] or run["request_decode_seconds"] or 0.0
    bound = 2 * (run["idle_ttft"] or 0.0) + decode
    within = f"<= 2 x idle TTFT + one request's decode time = {bound:.2f} s"
    better = divide(direct_worst, worst)
    return [
        Target.at_most("worst latecomer TTFT", within, label, worst, bound, bound * 1.25, " s"),
        Target.at_least(f"{FIFO_RATIO}{how}", ">= 10x better than direct FIFO", label, better, 10.0, 8.0, "x"),
    ]


def _door_target(s1: ScenarioResult, runs: dict[str, dict[str, Any]]) -> None:
    """The HTTP door against the gRPC door, same setup, same run: latecomer median TTFT ÷."""
    grpc_run, http_run = runs.get(HEADLINE), runs.get(HEADLINE_HTTP)
    if grpc_run is None or http_run is None:
        return  # the run that is missing is named in the notes
    grpc_median, http_median = latecomer_median(grpc_run), latecomer_median(http_run)
    wanted = f"<= {HTTP_RATIO:g}x the gRPC door's (round_robin + engine priorities, same run)"
    value = divide(http_median, grpc_median)
    s1.targets.append(Target.at_most(DOOR_RATIO, wanted, HEADLINE_HTTP, value, HTTP_RATIO, 1.25, "x"))
    s1.notes.append(
        f"HTTP door: the latecomers' median TTFT is {seconds(http_median)} through `POST /v1/completions` "
        f"(SSE; TTFT = the first chunk with text) against {seconds(grpc_median)} through gRPC `Stream` (the first "
        "delta), the same round_robin + engine-priorities setup run back to back; both doors feed the same "
        "queues, so a difference is the door's own cost plus the run-to-run noise of when a slot frees."
    )


_P = S1Params()
DEFINITION = Definition(
    id="S1",
    title="flood + latecomers",
    question="Does a user who arrives behind another user's flood get a first token about as fast as on an "
    "idle engine?",
    workload=f"user A sends {_P.flood} streamed requests at once ({_P.tokens_min}-{_P.tokens_max} output "
    f"tokens each, lengths spread so slots free at different times); users B and C send one request each "
    f"({_P.latecomer_tokens} tokens) {_P.latecomer_delay:g} s later, once the first wave starts to finish",
    layout="one simulated vLLM engine (`bench.engines.SimProfile`: 64 slots, decode step 20 ms + 0.3 ms per "
    "running request, prefill 0.05 ms per prompt token). Side by side in one run: the engine alone (its FIFO; "
    "its priority queue with the latecomers sending priority -1), and the scheduler in front of it with "
    f"each fairness policy ({', '.join(POLICIES)}) and with round_robin + engine priorities, the last by "
    "both doors (gRPC `Stream` and the HTTP door's `POST /v1/completions`)",
    measures="the latecomers' time to first token (worst and median), against the engine alone's",
    targets=(
        "worst latecomer TTFT <= 2 x idle TTFT + one request's decode time",
        "latecomer TTFT >= 10x better than the engine's FIFO",
        f"HTTP door's latecomer median <= {HTTP_RATIO:g}x the gRPC door's (same setup, same run)",
    ),
    duration="about 1.5 minutes, S2 included",
    facts=(
        "Engines do not preempt a running request, so a latecomer who arrives while the first wave holds every "
        "slot waits for the first slot to free, through the scheduler as with the engine's own priority queue: "
        "the bound's one request's decode time is that wait.",
        "Behind the engine's FIFO a latecomer waits for the whole flood; the scheduler keeps the engine's queue "
        "at the gate's waiting target, so a latecomer waits for at most one more of the flooding user's "
        "requests (round robin) before its own goes.",
    ),
    headline=(FIFO_RATIO, DOOR_RATIO),
)
UTILISATION = Definition(
    id="S2",
    title="utilisation",
    question="Does holding requests back cost the engine throughput?",
    workload="S1's runs",
    layout="S1's",
    measures=f"the engine's output tokens/s over a window of the flood ({_P.window:g} s from "
    f"{_P.window_start:g} s), through the scheduler against the engine alone",
    targets=(">= 95% of the engine alone's",),
    duration="S1's: S2 runs with S1",
    facts=(
        "The gate keeps a few requests waiting at the engine (the waiting target), enough that a freed slot "
        "is refilled inside the engine without waiting for the scheduler, so the batch stays full.",
    ),
    headline=(S2_FIGURE,),
)
SCENARIO = Scenario(
    (DEFINITION, UTILISATION),
    run,
    plots=(
        Plot("ttft", "s1_ttft.png", "S1: time to first token, flood (grey) vs latecomers", background="flood"),
        Plot("engine", "s1_engine.png", "S1: engine queue and batch during the flood"),
    ),
)

"""CB one engine budget: the engine's own waiting queue through a flood spread over several replicas.

Backlogged users (closed loops, far more requests outstanding than the engine has slots) send every call
to the next replica; the simulator's own `vllm:num_requests_waiting` is sampled every 50 ms over a window
after a warm-up. One scheduler process keeps it at the gate's waiting target; N independent processes side
by side each keep it at their own target (about N times the target: the engine's FIFO is back); N replicas
on Redis share one budget (the leader's estimator) and should keep it at the target again. Reported: max,
p99 and mean of the samples against the target, and the mean batch (a budget that starved the engine would
show there). Targets (for the replicas on Redis): the mean within the target + 1, and the p99
within one process's p99 (same run) plus a stated slack.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from bench.configs import STANDARD_CLASS, Toml, for_engine
from bench.engines import Engine, EngineProvider
from bench.records import percentile
from bench.results import ScenarioResult, Table, Target
from bench.runner import RunContext, run_modes
from bench.scenario import Definition, Options, Plot, Scenario
from bench.scenarios import cluster_layouts
from bench.scenarios.common import divide, errors, jsonable, not_run, number, ratio, raw_figures
from bench.scenarios.workloads import first_token

ID, TITLE = "CB", "one engine budget across replicas"
GATE_TARGET = 3
SLACK = 2  # requests over one process's p99 (same run) the cluster's p99 may reach


@dataclass(frozen=True)
class CBParams:
    users: int = 4  # backlogged users, every call to the next replica
    concurrency: int = 48  # per user: 192 outstanding against 64 engine slots
    tokens: int = 64  # every answer
    sample_interval: float = 0.05  # seconds between readings of the engine's waiting gauge
    warmup: float = 3.0  # seconds from the first token before the window
    window: float = 10.0  # seconds sampled
    timeout: float = 60.0  # for the first token


def config(engine: Engine) -> Toml:
    return for_engine(engine, fairness="round_robin", classes=STANDARD_CLASS, waiting_target=GATE_TARGET)


def waiting_figures(samples: list[tuple[float, float, float]], start: float, end: float) -> dict[str, Any]:
    """Max, p99 and mean of the engine's waiting gauge, and its mean running, over samples (t, waiting,
    running) taken in [start, end)."""
    inside = [(w, r) for t, w, r in samples if start <= t < end]
    waiting = [w for w, _ in inside]
    return {
        "samples": len(inside),
        "waiting_max": max(waiting) if waiting else None,
        "waiting_p99": percentile(waiting, 99),
        "waiting_mean": sum(waiting) / len(waiting) if waiting else None,
        "running_mean": sum(r for _, r in inside) / len(inside) if inside else None,
    }


async def _body(run: RunContext, p: CBParams) -> dict[str, Any]:
    run.probe.interval = p.sample_interval
    run.probe.start()
    stop = asyncio.Event()
    for i in range(p.users):
        run.closed_loop(f"u{i}", "flood", p.concurrency, p.tokens, f"User u{i} floods the engine.", stop)
    await first_token(run, p.timeout)
    await asyncio.sleep(p.warmup)  # the engine fills and the gate settles
    start = run.clock.now()
    await asyncio.sleep(p.window)  # the sampling window itself
    end = run.clock.now()
    stop.set()
    samples = [(s.t, s.waiting, s.running) for s in run.probe.samples]
    return {
        **waiting_figures(samples, start, end),
        "window": [start, end],
        "admitted_per_replica": await cluster_layouts.spread(run),
        "errors": errors(run.records),
        "_engine": samples,
    }


async def run(provider: EngineProvider, options: Options, p: CBParams | None = None) -> list[ScenarioResult]:
    p = p or CBParams()
    p = dataclasses.replace(p, window=p.window * options.cluster.scale)
    workload = (
        f"{p.users} users each keeping {p.concurrency} requests of {p.tokens} output tokens outstanding, every call "
        f"to the next replica; the engine's num_requests_waiting sampled every {p.sample_interval * 1000:.0f} ms "
        f"for {p.window:g} s after a {p.warmup:g} s warm-up; gate waiting target {GATE_TARGET}"
    )
    modes = cluster_layouts.modes(config, options.cluster.layouts())
    runs, skipped = await run_modes(provider, modes, lambda r: _body(r, p), timeout=p.warmup + p.window + p.timeout)
    if not runs:
        return [ScenarioResult.unavailable(ID, TITLE, workload, "; ".join(not_run(skipped)))]
    result = ScenarioResult(ID, TITLE, workload, provider.describe(), notes=not_run(skipped))
    reference = cluster_layouts.reference(runs)
    result.table = Table(
        [
            "run",
            "engine waiting max",
            "p99",
            "mean",
            f"mean ÷ target ({GATE_TARGET})",
            "mean batch",
            "samples",
            "admitted per replica",
        ]
    )
    for label, r in runs.items():
        result.table.rows.append(
            [
                label,
                number(r["waiting_max"]),
                number(r["waiting_p99"], 1),
                number(r["waiting_mean"], 1),
                ratio(divide(r["waiting_mean"], GATE_TARGET), 2),
                number(r["running_mean"], 1),
                str(r["samples"]),
                cluster_layouts.spread_text(r["admitted_per_replica"]),
            ]
        )
    for label, r in runs.items():
        if cluster_layouts.is_cluster(label):
            result.targets += _targets(label, r, reference)
    result.notes.append(
        f"Mean: the queue the gate keeps on average, held to the target + 1. P99: held to one process's p99 in "
        f"the same run + {SLACK} (one process's own overshoot, its dispatches the engine has not shown yet when "
        "the gate reads its last scrape, every 0.1 s here, grows with the machine's load; the cluster must not "
        "add more than the slack to it). The max is one sample, shown only."
    )
    result.raw = raw_figures(runs)
    result.series = {
        "gate_target": GATE_TARGET,
        "runs": {label: {"engine": jsonable(r["_engine"])} for label, r in runs.items()},
    }
    return [result]


def _targets(label: str, r: dict[str, Any], reference: dict[str, Any] | None) -> list[Target]:
    targets = [
        Target(
            "engine waiting mean (sampled every 50 ms)",
            f"<= gate waiting target + 1 = {GATE_TARGET + 1}",
            label,
            r["waiting_mean"],
            threshold=GATE_TARGET + 1,
            fail_at=GATE_TARGET + 2,
            higher_is_better=False,
        )
    ]
    if reference is not None and reference["waiting_p99"] is not None:
        bound = max(float(GATE_TARGET), reference["waiting_p99"]) + SLACK
        targets.append(
            Target(
                "engine waiting p99 (sampled every 50 ms)",
                f"<= one process's p99 (same run) + {SLACK} = {bound:g}",
                label,
                r["waiting_p99"],
                threshold=bound,
                fail_at=bound + SLACK,
                higher_is_better=False,
            )
        )
    return targets


_P = CBParams()
DEFINITION = Definition(
    id="CB",
    title=TITLE,
    question="Do several replicas keep one engine budget, or does each fill the engine's queue on its own?",
    workload=f"{_P.users} users with {_P.concurrency} requests outstanding each ({_P.tokens} tokens), every call to "
    "the next replica",
    layout=f"the simulator (64 slots); gate waiting target {GATE_TARGET}; one scheduler process, N independent "
    "processes and N replicas on Redis",
    measures=f"the engine's own vllm:num_requests_waiting sampled every {_P.sample_interval * 1000:g} ms for "
    f"{_P.window:g} s after a {_P.warmup:g} s warm-up: max, p99, mean; the mean batch",
    targets=(
        f"replicas on Redis: mean waiting <= the target + 1 ({GATE_TARGET + 1})",
        "replicas on Redis: p99 within one process's p99 plus a stated slack",
    ),
    duration="under a minute",
    facts=("Independent processes keep about N times the target waiting at the engine: its FIFO is back.",),
    headline=("engine waiting mean (sampled every 50 ms)",),
)
SCENARIO = Scenario(
    (DEFINITION,),
    run,
    plots=(Plot("engine", "cb_engine.png", "CB: the engine's queue and batch, flood spread over the replicas"),),
)

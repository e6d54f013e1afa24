"""C3 weighted shares across replicas: S3 (users weighted 1, 2 and 4, all backlogged) with every client call
sent to the next scheduler replica.

The same closed loops as S3, for one scheduler process, N independent processes side by side (each computes
the weighted order of only the calls it received) and N replicas on Redis (one order for all). Target (S3's,
for the replicas on Redis): every user's token share within 5% of its weight's share.

Measured over the whole workload from the first token (`WINDOW` seconds, no warm-up), not over a window
inside it: the users start one after the other, and whoever's requests reach the deciding scheduler first
fills the idle engine before the others are queued (through replicas on Redis, where the others' requests
take a hop to reach the leader, the first user gets about a quarter of the first slots); weighted round
robin then charges it and it repays over the next seconds. A short window placed just after the start
(S3's 3 s warm-up + 8 s) catches the repayment (w1 at 7-11% in 4 s slices, 14.3% from 8 s on: engine
journal of a probe run) and reads it as unfairness; the whole workload counts both.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bench.engines import EngineProvider
from bench.results import ScenarioResult, Table
from bench.runner import RunContext, run_modes
from bench.scenario import Definition, Options, Plot, Scenario
from bench.scenarios import cluster_layouts, s3
from bench.scenarios.common import not_run, number, raw_figures, share, token_series

ID, TITLE = "C3", "weighted shares across replicas"
WINDOW = 20.0  # seconds from the first token: the whole workload


async def _body(run: RunContext, p: s3.S3Params) -> dict[str, Any]:
    measured = await s3.body(run, p)
    measured["admitted_per_replica"] = await cluster_layouts.spread(run)
    return measured


async def run(provider: EngineProvider, options: Options, p: s3.S3Params | None = None) -> list[ScenarioResult]:
    p = p or s3.S3Params()
    p = dataclasses.replace(p, warmup=0.0, window=WINDOW * options.cluster.scale)
    weights = ", ".join(f"{u} = {w:g}" for u, w in s3.WEIGHTS.items())
    workload = (
        f"users with weights {weights}, each keeping {p.concurrency} requests of {p.tokens} output tokens "
        f"outstanding, every call to the next replica; output tokens counted over {p.window:g} s, starting "
        f"{p.warmup:g} s after the first token"
    )
    modes = cluster_layouts.modes(s3.config, options.cluster.layouts())
    runs, skipped = await run_modes(provider, modes, lambda r: _body(r, p), timeout=p.warmup + p.window + p.timeout)
    if not runs:
        return [ScenarioResult.unavailable(ID, TITLE, workload, "; ".join(not_run(skipped)))]
    result = ScenarioResult(ID, TITLE, workload, provider.describe(), notes=not_run(skipped))
    result.table = Table(
        [
            "run",
            *(f"tokens {u}" for u in s3.WEIGHTS),
            "shares (target 14.3 / 28.6 / 57.1%)",
            "worst gap",
            "engine tokens/s",
            "mean batch",
            "admitted per replica",
        ]
    )
    for label, r in runs.items():
        engine = [number(r["engine_tokens_per_s"]), number(r["running_mean"], 1)]
        spread = cluster_layouts.spread_text(r["admitted_per_replica"])
        result.table.rows.append([label, *s3.share_cells(r), share(s3.deviation(r["shares"])), *engine, spread])
        if cluster_layouts.is_cluster(label):
            result.targets.append(s3.share_target(label, r["shares"]))
    result.notes.append(
        "Memory mode with several replicas (independent processes side by side) is reported, not held to the "
        "target: each replica orders only the calls it received and gates the engine alone, so the engine's "
        "queue grows to several times the target and its own FIFO decides much of the order."
    )
    result.raw, result.series = raw_figures(runs), token_series(runs)
    return [result]


DEFINITION = Definition(
    id="C3",
    title=TITLE,
    question="Do weighted shares hold when every call goes to the next replica?",
    workload=f"S3's closed loops (weights 1, 2, 4), every call to the next replica, {WINDOW:g} s from the first "
    "token (the whole workload)",
    layout="the simulator; one scheduler process, N independent processes and N replicas on Redis",
    measures="each user's token share over the whole workload, and the engine's tokens/s",
    targets=("replicas on Redis: every user's token share within 5% of its weight's share",),
    duration="about a minute",
    facts=(
        "The first user whose requests reach the leader fills the idle engine's first slots and repays them "
        "over the next seconds, so the share is measured over the whole workload, not a window just after "
        "the start.",
        "Independent processes each order only the calls they received: the engine's own FIFO decides much of "
        "the order.",
    ),
    headline=(s3.TARGET_FIGURE,),
)
SCENARIO = Scenario(
    (DEFINITION,),
    run,
    plots=(Plot("tokens", "c3_tokens.png", "C3: output tokens per user, weights 1:2:4 across replicas"),),
)

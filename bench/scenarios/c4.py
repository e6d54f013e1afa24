"""C4 token fairness across replicas: S4 (long answers against short ones, both backlogged, `vtc`) with every
client call sent to the next scheduler replica, shortened for the bench.

S4's method unchanged (closed loops of 8 streams each on 8 engine slots, a warm-up of two long-request
lifetimes from the first token, output tokens counted cumulatively and in sliding windows), with answers
of 300 and 15 tokens (S4's 20:1) so a run takes about half a minute instead of six. Runs: one scheduler
process, N independent processes side by side (each counts the tokens of only its own calls) and N replicas
on Redis (one counter per user). Target (for the replicas on Redis): |long ÷ short - 1| within
10% over the window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable
from typing import Any

from bench.engines import EngineProvider, SimProvider
from bench.results import ScenarioResult, Table
from bench.runner import RunContext, run_modes
from bench.scenario import Definition, Options, Plot, Scenario
from bench.scenarios import cluster_layouts, s4
from bench.scenarios.common import not_run, raw_figures, token_series

ID, TITLE = "C4", "token fairness across replicas"
LONG, SHORT = s4.LONG, s4.SHORT
SHORT_RUN = s4.S4Params(long_tokens=300, short_tokens=15, window=20.0, slice=10.0, slide=2.5)


async def _body(run: RunContext, p: s4.S4Params, warmup: float) -> dict[str, Any]:
    measured = await s4.body(run, p, p.window, warmup)
    measured["admitted_per_replica"] = await cluster_layouts.spread(run)
    return measured


async def run(provider: EngineProvider, options: Options, p: s4.S4Params | None = None) -> list[ScenarioResult]:
    p = p or SHORT_RUN
    p = dataclasses.replace(p, window=p.window * options.cluster.scale)
    if not isinstance(provider, SimProvider):
        return [ScenarioResult.unavailable(ID, TITLE, "-", "runs on the simulator only")]
    provider = SimProvider(dataclasses.replace(provider.profile, max_num_seqs=p.max_num_seqs))
    warmup = p.warmup_lifetimes * p.long_tokens * provider.profile.step_seconds(p.max_num_seqs)
    workload = s4.workload(p, warmup, ", `vtc`, every call to the next replica")

    def measure(r: RunContext) -> Awaitable[dict[str, Any]]:
        return _body(r, p, warmup)

    modes = cluster_layouts.modes(s4.config("vtc"), options.cluster.layouts())
    runs, skipped = await run_modes(provider, modes, measure, timeout=warmup + p.window + p.timeout)
    if not runs:
        return [ScenarioResult.unavailable(ID, TITLE, workload, "; ".join(not_run(skipped)))]
    result = ScenarioResult(ID, TITLE, workload, provider.describe(), notes=not_run(skipped))
    result.table = Table([*s4.table_columns(p), "admitted per replica"])
    for label, r in runs.items():
        result.table.rows.append([*s4.table_row(label, r), cluster_layouts.spread_text(r["admitted_per_replica"])])
        if cluster_layouts.is_cluster(label):
            result.targets.append(s4.cumulative_target(label, r, p, 0.10, 0.15))
    result.notes.append(
        f"Shortened from S4 ({s4.S4Params().long_tokens}/{s4.S4Params().short_tokens} tokens, "
        f"{s4.S4Params().window:g} s): the sliding windows are shown, not held to S4's 15% (windows this short "
        "hold only a few long requests' ends). `--cluster-scale` stretches the window."
    )
    result.raw, result.series = raw_figures(runs), token_series(runs)
    return [result]


DEFINITION = Definition(
    id="C4",
    title=TITLE,
    question="Does token fairness (vtc) hold across replicas?",
    workload=f"S4's method shortened: {SHORT_RUN.long_tokens}- and {SHORT_RUN.short_tokens}-token answers, 8 "
    f"closed-loop streams each, {SHORT_RUN.window:g} s, every call to the next replica",
    layout="the simulator (8 slots); one scheduler process, N independent processes and N replicas on Redis",
    measures="|long ÷ short - 1| of output tokens over the window",
    targets=("replicas on Redis: within 10%",),
    duration="about 2 minutes",
    facts=("Independent processes each count only the tokens of their own calls, so none of them is token-fair.",),
    headline=(s4.CUMULATIVE,),
)
SCENARIO = Scenario(
    (DEFINITION,),
    run,
    plots=(Plot("tokens", "c4_tokens.png", "C4: output tokens per user, long vs short answers across replicas"),),
)

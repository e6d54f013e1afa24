"""C1 flood + latecomers across replicas: S1 with every client call sent to the next scheduler replica.

User A floods requests at once (spread round robin over the replicas, as a load balancer would); latecomers
(each its own user) send one request each at several times through the flood, so they land on every
replica. Measured: the latecomers' TTFT, median and worst, over the whole workload, for the engine alone
(FIFO), one scheduler process, N independent processes side by side (memory mode: each fills the engine's
queue to its own target and orders only its own calls) and N replicas on Redis (one scheduler). Targets
(S1's, for the replicas on Redis): worst latecomer TTFT <= 2 x idle TTFT + one request's decode time, and
>= 10x better than the engine's FIFO.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any

from bench.configs import STANDARD_CLASS, Toml, for_engine
from bench.engines import Engine, EngineProvider
from bench.records import RequestRecord
from bench.results import ScenarioResult, Table
from bench.runner import Mode, RunContext, run_modes
from bench.scenario import Definition, Options, Plot, Scenario
from bench.scenarios import cluster_layouts
from bench.scenarios.common import divide, errors, not_run, ratio, seconds, ttft_series, with_requests
from bench.scenarios.s1 import latecomer_targets
from bench.scenarios.workloads import decode_median, flood, idle_probe

ID, TITLE = "C1", "flood + latecomers across replicas"
GATE_TARGET = 3
DIRECT = "engine alone (FIFO)"


@dataclass(frozen=True)
class C1Params:
    flood: int = 200  # requests user A sends at once, spread over the replicas
    tokens_min: int = 100  # each flood answer's length is drawn from tokens_min-tokens_max (seeded)
    tokens_max: int = 300
    latecomer_tokens: int = 32  # only their first token is measured
    latecomer_offsets: tuple[float, ...] = (5.0, 8.0, 11.0, 14.0)  # once the first wave starts to finish
    latecomers_per_offset: int = 2  # each its own user
    probe_tokens: int = 16  # the idle engine's probe request
    timeout: float = 90.0  # for the latecomers' first tokens
    seed: int = 1  # of the flood's answer lengths

    def scaled(self, scale: float) -> C1Params:
        """A longer (or shorter) flood, latecomers spread over it in proportion."""
        return dataclasses.replace(
            self,
            flood=max(1, round(self.flood * scale)),
            latecomer_offsets=tuple(o * scale for o in self.latecomer_offsets),
        )


def config(engine: Engine) -> Toml:
    return for_engine(engine, fairness="round_robin", classes=STANDARD_CLASS, waiting_target=GATE_TARGET)


async def _body(run: RunContext, p: C1Params) -> dict[str, Any]:
    idle = await idle_probe(run, p.probe_tokens)
    flood(run, p.flood, p.tokens_min, p.tokens_max, p.seed)
    late: list[RequestRecord] = []
    for offset in p.latecomer_offsets:
        await asyncio.sleep(max(0.0, offset - run.clock.now()))  # latecomers arrive at fixed times
        for _ in range(p.latecomers_per_offset):
            user = f"L{len(late) + 1}"
            late.append(run.send(user, "latecomer", p.latecomer_tokens, f"User {user} asks a question."))
    await run.until(lambda: all(r.first_token is not None or r.error for r in late), p.timeout)
    return {
        "idle_ttft": idle.ttft,
        "latecomer_ttft": [r.ttft for r in late],
        "latecomer_replica": [r.replica for r in late],
        "request_decode_seconds": decode_median(run.records),
        "admitted_per_replica": await cluster_layouts.spread(run),
        "errors": errors(run.records),
        "_records": list(run.records),
        "_engine": [(s.t, s.waiting, s.running) for s in run.probe.samples],
    }


def worst(run: dict[str, Any]) -> float | None:
    """The worst latecomer TTFT; None if a latecomer got no token (a figure would hide that)."""
    values = run["latecomer_ttft"]
    return None if not values or any(v is None for v in values) else max(values)


def median(run: dict[str, Any]) -> float | None:
    values = run["latecomer_ttft"]
    return None if not values or any(v is None for v in values) else statistics.median(values)


async def run(provider: EngineProvider, options: Options, p: C1Params | None = None) -> list[ScenarioResult]:
    p = (p or C1Params()).scaled(options.cluster.scale)
    latecomers = len(p.latecomer_offsets) * p.latecomers_per_offset
    workload = (
        f"user A floods {p.flood} requests at once ({p.tokens_min}-{p.tokens_max} output tokens each), "
        f"{latecomers} latecomers (one request each, own users) at "
        f"{', '.join(f'{o:g}' for o in p.latecomer_offsets)} s; every call to the next replica; gate waiting "
        f"target {GATE_TARGET}"
    )
    modes = [Mode(DIRECT), *cluster_layouts.modes(config, options.cluster.layouts())]
    runs, skipped = await run_modes(provider, modes, lambda r: _body(r, p), timeout=p.timeout + 60)
    direct = runs.get(DIRECT)
    if direct is None:
        return [ScenarioResult.unavailable(ID, TITLE, workload, skipped.get(DIRECT, "the direct run failed"))]
    result = ScenarioResult(ID, TITLE, workload, provider.describe(), notes=not_run(skipped))
    reference = cluster_layouts.reference(runs)
    result.table = Table(
        [
            "run",
            "idle TTFT",
            "latecomer TTFT median",
            "latecomer TTFT worst",
            "worst ÷ one process",
            "engine FIFO ÷ run (worst)",
            "admitted per replica",
        ]
    )
    for label, r in runs.items():
        result.table.rows.append(
            [
                label,
                seconds(r["idle_ttft"]),
                seconds(median(r)),
                seconds(worst(r)),
                "-" if reference is None or label == DIRECT else ratio(divide(worst(r), worst(reference)), 2),
                ratio(divide(worst(direct), worst(r))),
                cluster_layouts.spread_text(r["admitted_per_replica"]),
            ]
        )
        if cluster_layouts.is_cluster(label):
            result.targets += latecomer_targets(label, worst(r), r, direct, worst(direct), " (worst)")
    result.notes += [
        "One request's decode time in the bound is the median first-to-last-token time of the flood's requests "
        "in the engine-alone run.",
        "Memory mode with several replicas is independent processes side by side: each replica keeps the engine's "
        f"waiting queue at its own target ({GATE_TARGET}), so a latecomer waits behind N times as many requests "
        "in the engine's FIFO; it is reported, not held to the targets.",
        "Admitted per replica: each replica's own llmsched_requests_admitted_total (one warm-up request each "
        "included), which shows the round robin at work.",
    ]
    result.raw = {label: with_requests(r) for label, r in runs.items()}
    result.series = ttft_series(runs, GATE_TARGET)
    return [result]


_P = C1Params()
DEFINITION = Definition(
    id="C1",
    title=TITLE,
    question="Does S1 hold when clients spread their calls over several replicas?",
    workload=f"S1's flood ({_P.flood} requests of {_P.tokens_min}-{_P.tokens_max} tokens) with every call sent to "
    f"the next replica; {_P.latecomers_per_offset} latecomers at each of "
    f"{', '.join(f'{o:g}' for o in _P.latecomer_offsets)} s",
    layout="the simulator (64 slots); the engine alone (FIFO), one scheduler process, N independent processes "
    "(memory mode) and N replicas on a private redis-server (`--replicas`, default 3)",
    measures="the latecomers' TTFT, median and worst, over the whole workload",
    targets=(
        "replicas on Redis: worst latecomer TTFT <= 2 x idle TTFT + one request's decode time",
        "replicas on Redis: >= 10x better than the engine's FIFO",
    ),
    duration="about 1.5 minutes; make bench-cluster runs every cluster scenario",
    facts=(
        "Independent processes each keep the engine's queue at their own target, so a latecomer waits behind "
        "N times as many requests in the engine's FIFO; replicas on Redis keep one budget.",
    ),
    headline=("latecomer TTFT, engine FIFO ÷ scheduler (worst)",),
)
SCENARIO = Scenario(
    (DEFINITION,),
    run,
    plots=(
        Plot(
            "ttft",
            "c1_ttft.png",
            "C1: time to first token across replicas, flood (grey) vs latecomers",
            background="flood",
        ),
    ),
)

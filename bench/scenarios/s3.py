"""S3 weighted shares: users with weights 1, 2 and 4, all backlogged, served in proportion.

Each user keeps the same number of equal-length requests outstanding (a closed loop), so the engine alone
serves them about equally; `weighted_round_robin` should give them output tokens in the ratio 1:2:4 over a
window taken after a warm-up (equal lengths make request shares and token shares the same thing).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from bench.configs import STANDARD_CLASS, Toml, for_engine
from bench.engines import Engine, EngineProvider
from bench.records import cumulative_tokens, tokens_by_user
from bench.results import ScenarioResult, Table, Target
from bench.runner import Mode, RunContext, run_modes
from bench.scenario import Definition, Options, Plot, Scenario
from bench.scenarios.common import errors, not_run, number, raw_figures, share, token_series
from bench.scenarios.workloads import measuring_window

WEIGHTS = {"w1": 1.0, "w2": 2.0, "w4": 4.0}
DIRECT = "engine alone (FIFO)"
TITLE = "weighted shares"
TARGET_FIGURE = "largest relative gap between a user's token share and its weight share"


@dataclass(frozen=True)
class S3Params:
    concurrency: int = 64  # requests each user keeps outstanding
    tokens: int = 32  # every answer's length (equal: request and token shares are the same)
    warmup: float = 3.0  # seconds from the first token before the window
    window: float = 8.0  # seconds of output tokens counted
    timeout: float = 60.0  # for the first token


def config(engine: Engine) -> Toml:
    return for_engine(engine, fairness="weighted_round_robin", weights=WEIGHTS, classes=STANDARD_CLASS)


def modes() -> list[Mode]:
    return [Mode(DIRECT), Mode("scheduler, weighted_round_robin", config=config)]


async def body(run: RunContext, p: S3Params) -> dict[str, Any]:
    run.probe.start()
    stop = asyncio.Event()
    for user in WEIGHTS:
        run.closed_loop(user, "backlog", p.concurrency, p.tokens, f"User {user} wants an answer.", stop)
    start, end, engine_rate = await measuring_window(run, p.warmup, p.window, p.timeout)
    stop.set()
    tokens = tokens_by_user(run.records, start, end)
    total = sum(tokens.values()) or 1
    return {
        "tokens": tokens,
        "shares": {u: tokens.get(u, 0) / total for u in WEIGHTS},
        "engine_tokens_per_s": engine_rate,
        "running_mean": run.probe.mean_running(start, end),
        "window": [start, end],
        "errors": errors(run.records),
        "_cumulative": cumulative_tokens(run.records, 0.25, end + 1.0),
    }


def deviation(shares: dict[str, float]) -> float:
    """The largest relative gap between a user's share and its weight's share."""
    total_weight = sum(WEIGHTS.values())
    return max(abs(shares[u] / (w / total_weight) - 1) for u, w in WEIGHTS.items())


def share_cells(r: dict[str, Any]) -> list[str]:
    """A run's tokens per user and their shares (S3's table and C3's)."""
    shares = r["shares"]
    return [*(number(r["tokens"].get(u, 0)) for u in WEIGHTS), " / ".join(share(shares[u]) for u in WEIGHTS)]


def share_target(label: str, shares: dict[str, float]) -> Target:
    """Every user's token share within 5% (relative) of its weight's share."""
    gap = deviation(shares)
    return Target.at_most(TARGET_FIGURE, "within 5% of 1:2:4", label, gap, 0.05, 0.08, "%")


async def run(
    provider: EngineProvider, options: Options | None = None, p: S3Params | None = None
) -> list[ScenarioResult]:
    p = p or S3Params()
    weights = ", ".join(f"{u} = {w:g}" for u, w in WEIGHTS.items())
    workload = (
        f"users with weights {weights}, each keeping {p.concurrency} requests of {p.tokens} output tokens "
        f"outstanding; output tokens counted over {p.window:g} s, starting {p.warmup:g} s after the first token"
    )
    runs, skipped = await run_modes(provider, modes(), lambda r: body(r, p), timeout=p.warmup + p.window + p.timeout)
    if not runs:
        return [ScenarioResult.unavailable("S3", TITLE, workload, "; ".join(not_run(skipped)))]
    result = ScenarioResult("S3", TITLE, workload, provider.describe(), notes=not_run(skipped))
    total_weight = sum(WEIGHTS.values())
    result.table = Table(
        [
            "run",
            *(f"tokens {u}" for u in WEIGHTS),
            "shares (target 14.3 / 28.6 / 57.1%)",
            "tokens w4 ÷ w1",
            "worst gap",
            "engine tokens/s",
            "mean batch",
        ]
    )
    for label, r in runs.items():
        w4_over_w1 = f"{r['tokens'].get('w4', 0) / max(1, r['tokens'].get('w1', 0)):.2f}"
        engine = [number(r["engine_tokens_per_s"]), number(r["running_mean"], 1)]
        result.table.rows.append([label, *share_cells(r), w4_over_w1, share(deviation(r["shares"])), *engine])
        if label != DIRECT:
            result.targets.append(share_target(label, r["shares"]))
    result.notes.append("Weight shares: " + ", ".join(f"{u} {w / total_weight:.1%}" for u, w in WEIGHTS.items()) + ".")
    result.raw, result.series = raw_figures(runs), token_series(runs)
    return [result]


_P = S3Params()
DEFINITION = Definition(
    id="S3",
    title=TITLE,
    question="Do users with weights get their weighted share of the engine?",
    workload=f"users w1, w2 and w4 (weights 1, 2 and 4) each keep {_P.concurrency} requests of {_P.tokens} "
    "output tokens outstanding (closed loops, all backlogged)",
    layout="the simulator (S1's profile); the engine alone (FIFO) and the scheduler with weighted_round_robin",
    measures=f"each user's share of the output tokens over {_P.window:g} s after a {_P.warmup:g} s warm-up",
    targets=("every user's token share within 5% (relative) of its weight's share, 1:2:4",),
    duration="under half a minute",
    facts=(
        "With equal lengths the engine alone serves the three users about equally; request shares and token "
        "shares are the same thing here, which weighted_round_robin divides by weight.",
    ),
    headline=(TARGET_FIGURE,),
)
SCENARIO = Scenario(
    (DEFINITION,), run, plots=(Plot("tokens", "s3_tokens.png", "S3: output tokens per user, weights 1:2:4"),)
)

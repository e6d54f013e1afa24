"""S3 weighted shares: users with weights 1, 2 and 4, all backlogged, served in proportion.

Each user keeps the same number of equal-length requests outstanding (a closed loop), so the engine alone
serves them about equally; `weighted_round_robin` should give them output tokens in the ratio 1:2:4 over a
window taken after a warm-up (equal lengths make request shares and token shares the same thing).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from bench.configs import scheduler_config
from bench.engines import EngineProvider
from bench.records import cumulative_tokens, tokens_by_user
from bench.results import ScenarioResult, Table, Target
from bench.runner import SCHEDULED_MODEL, Mode, RunContext
from bench.scenarios._common import (
    STANDARD_CLASS,
    jsonable,
    measuring_window,
    not_run,
    number,
    run_modes,
    share,
)
from bench.scenarios.definition import Definition

WEIGHTS = {"w1": 1.0, "w2": 2.0, "w4": 4.0}
DIRECT = "engine alone (FIFO)"
TITLE = "weighted shares"


@dataclass(frozen=True)
class S3Params:
    concurrency: int = 64
    tokens: int = 32
    warmup: float = 3.0
    window: float = 8.0
    timeout: float = 60.0


def config(engine: Any) -> Any:
    return scheduler_config(
        engine_url=engine.url,
        model=SCHEDULED_MODEL,
        engine_model=engine.model,
        max_num_seqs=engine.max_num_seqs,
        fairness="weighted_round_robin",
        weights=WEIGHTS,
        classes=STANDARD_CLASS,
    )


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
        "errors": sorted({r.error for r in run.records if r.error and r.error != "cancelled"}),
        "_cumulative": cumulative_tokens(run.records, 0.25, end + 1.0),
    }


def deviation(shares: dict[str, float]) -> float:
    """The largest relative gap between a user's share and its weight's share."""
    total_weight = sum(WEIGHTS.values())
    return max(abs(shares[u] / (w / total_weight) - 1) for u, w in WEIGHTS.items())


async def run(provider: EngineProvider, p: S3Params | None = None) -> list[ScenarioResult]:
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
        shares = r["shares"]
        result.table.rows.append(
            [
                label,
                *(number(r["tokens"].get(u, 0)) for u in WEIGHTS),
                " / ".join(share(shares[u]) for u in WEIGHTS),
                f"{r['tokens'].get('w4', 0) / max(1, r['tokens'].get('w1', 0)):.2f}",
                share(deviation(shares)),
                number(r["engine_tokens_per_s"]),
                number(r["running_mean"], 1),
            ]
        )
        if label != DIRECT:
            result.targets.append(
                Target(
                    "largest relative gap between a user's token share and its weight share",
                    "within 5% of 1:2:4",
                    label,
                    deviation(shares),
                    threshold=0.05,
                    fail_at=0.08,
                    higher_is_better=False,
                    unit="%",
                )
            )
    result.notes.append("Weight shares: " + ", ".join(f"{u} {w / total_weight:.1%}" for u, w in WEIGHTS.items()) + ".")
    result.raw = {label: jsonable({k: v for k, v in r.items() if not k.startswith("_")}) for label, r in runs.items()}
    result.series = {
        "step": 0.25,
        "windows": {label: r["window"] for label, r in runs.items()},
        "runs": {label: r["_cumulative"] for label, r in runs.items()},
    }
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
    command="python -m bench --scenarios S3",
    duration="under half a minute",
    facts=(
        "With equal lengths the engine alone serves the three users about equally; request shares and token "
        "shares are the same thing here, which weighted_round_robin divides by weight.",
    ),
    headline=("largest relative gap between a user's token share and its weight share",),
)

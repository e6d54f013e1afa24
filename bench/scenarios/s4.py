"""S4 token fairness: a user asking for 1000-token answers against one asking for 50-token answers.

Both stay backlogged (closed loops). Counting requests (`round_robin`, or the engine's FIFO) hands the
long-answer user about 20 times the tokens once the batch has settled, because each of its requests holds a
batch slot 20 times longer; the Virtual Token Counter (`vtc`) charges tokens as they stream and should
give both about the same. Prompts are a couple of tokens, because VTC also charges prompt tokens and the
scenario is about output tokens.

A 1000-token request holds its batch slot for about one long-request lifetime (1000 decode steps) and
the engine never preempts it. So whatever share the long user's first requests take when the idle
engine fills (nothing is queued yet, no policy chooses) it keeps for a whole lifetime, and `vtc` can only
even it out afterwards: it counts service cumulatively and pays a user's surplus back once those slots
free. VTC's guarantee is accordingly about the whole backlogged period (the difference between two
backlogged users' service stays bounded), not any short window: the target is measured over two
lifetimes from the first token. The 15 s window one lifetime in, where that payback happens, is
reported beside it. To keep this within the suite's budget the engine gets 32 batch slots instead of
64 (same per-step timing, so steps are shorter and a lifetime is about 30 s); 32 slots still resolve a
10% share difference.

The engine alone is not run: its FIFO counts requests just as `round_robin` does (the 20:1 reference).
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from bench.configs import scheduler_config
from bench.engines import EngineProvider, SimProvider
from bench.records import cumulative_tokens, tokens_by_user
from bench.results import ScenarioResult, Table, Target
from bench.runner import SCHEDULED_MODEL, Mode, RunContext
from bench.scenarios._common import STANDARD_CLASS, jsonable, measuring_window, not_run, number, run_modes

TITLE = "token fairness"
LONG, SHORT = "long", "short"


@dataclass(frozen=True)
class S4Params:
    long_tokens: int = 1000
    short_tokens: int = 50
    long_concurrency: int = 48
    short_concurrency: int = 48
    max_num_seqs: int = 32
    warmup: float = 0.0  # the whole backlogged period counts: VTC's guarantee is cumulative
    window: float = 60.0  # two long lifetimes
    payback_window: tuple[float, float] = (30.0, 45.0)  # reported: one lifetime in, seconds after the start
    timeout: float = 60.0


def modes() -> list[Mode]:
    def config(policy: str) -> Any:
        return lambda engine: scheduler_config(
            engine_url=engine.url,
            model=SCHEDULED_MODEL,
            engine_model=engine.model,
            max_num_seqs=engine.max_num_seqs,
            fairness=policy,
            classes=STANDARD_CLASS,
        )

    return [
        Mode("scheduler, round_robin", config=config("round_robin")),
        Mode("scheduler, vtc", config=config("vtc")),
    ]


async def _body(run: RunContext, p: S4Params) -> dict[str, Any]:
    run.probe.start()
    stop = asyncio.Event()
    for i in range(max(p.long_concurrency, p.short_concurrency)):  # interleaved, so neither arrives first
        if i < p.long_concurrency:
            run.closed_loop(LONG, "backlog", 1, p.long_tokens, f"L{i}", stop)
        if i < p.short_concurrency:
            run.closed_loop(SHORT, "backlog", 1, p.short_tokens, f"S{i}", stop)
    start, end, engine_rate = await measuring_window(run, p.warmup, p.window, p.timeout)
    stop.set()
    tokens = tokens_by_user(run.records, start, end)
    payback = tokens_by_user(run.records, start + p.payback_window[0], start + p.payback_window[1])
    return {
        "payback_long_over_short": payback.get(LONG, 0) / max(1, payback.get(SHORT, 0)),
        "tokens": tokens,
        "engine_tokens_per_s": engine_rate,
        "long_over_short": tokens.get(LONG, 0) / max(1, tokens.get(SHORT, 0)),
        "window": [start, end],
        "errors": sorted({r.error for r in run.records if r.error and r.error != "cancelled"}),
        "_cumulative": cumulative_tokens(run.records, 0.25, end + 1.0),
    }


async def run(provider: EngineProvider, p: S4Params | None = None) -> list[ScenarioResult]:
    p = p or S4Params()
    if isinstance(provider, SimProvider):
        provider = SimProvider(dataclasses.replace(provider.profile, max_num_seqs=p.max_num_seqs))
    workload = (
        f"user '{LONG}' keeps {p.long_concurrency} requests of {p.long_tokens} output tokens outstanding, user "
        f"'{SHORT}' {p.short_concurrency} of {p.short_tokens}; output tokens counted over {p.window:g} s, starting "
        f"{p.warmup:g} s after the first token (two lifetimes of a long request)"
    )
    runs, skipped = await run_modes(provider, modes(), lambda r: _body(r, p), timeout=p.warmup + p.window + p.timeout)
    if not runs:
        return [ScenarioResult.unavailable("S4", TITLE, workload, "; ".join(not_run(skipped)))]
    result = ScenarioResult("S4", TITLE, workload, provider.describe(), notes=not_run(skipped))
    result.table = Table(["run", f"tokens {LONG}", f"tokens {SHORT}", f"{LONG} ÷ {SHORT}", "engine tokens/s"])
    for label, r in runs.items():
        result.table.rows.append(
            [
                label,
                number(r["tokens"].get(LONG, 0)),
                number(r["tokens"].get(SHORT, 0)),
                f"{r['long_over_short']:.2f}",
                number(r["engine_tokens_per_s"]),
            ]
        )
        if label.endswith("vtc"):
            result.targets.append(
                Target(
                    f"|tokens {LONG} ÷ tokens {SHORT} - 1|",
                    "within 10% of equal with token-cost fairness",
                    label,
                    abs(r["long_over_short"] - 1),
                    threshold=0.10,
                    fail_at=0.20,
                    higher_is_better=False,
                    unit="%",
                )
            )
    for label, r in runs.items():
        result.notes.append(
            f"{label}: {LONG} ÷ {SHORT} in the {p.payback_window[1] - p.payback_window[0]:g} s window "
            f"{p.payback_window[0]:g} s in (one lifetime, when the first long answers end): "
            f"{r['payback_long_over_short']:.2f}."
        )
    result.notes.append(
        f"Request-count fairness is expected near {p.long_tokens / p.short_tokens:.0f}:1 once the batch has "
        "settled (the reference the VTC result is measured against, not a target)."
    )
    result.raw = {label: jsonable({k: v for k, v in r.items() if not k.startswith("_")}) for label, r in runs.items()}
    result.series = {
        "step": 0.25,
        "windows": {label: r["window"] for label, r in runs.items()},
        "runs": {label: r["_cumulative"] for label, r in runs.items()},
    }
    return [result]

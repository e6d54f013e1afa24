"""S4 token fairness: a user asking for 1000-token answers against one asking for 50-token answers.

Both stay backlogged (closed loops of 8 streams each) on an engine with 8 slots.
Counting requests (`round_robin`, or the engine's FIFO) hands the long-answer user about 20 times the
tokens once the batch has settled, because each of its requests holds a slot 20 times longer; the Virtual
Token Counter (`vtc`) charges tokens as they stream and should give both the same. Prompts are a couple of
tokens, because VTC also charges prompt tokens and the scenario is about output tokens.

Measured after a warm-up of two long lifetimes from the first token (whatever the long user's first
requests took when the idle engine filled, no policy chose it, and it is held for a whole lifetime), over
5 minutes: |long/short - 1| cumulatively (target 0.05) and in every 60 s window, one starting every 5 s
(target 0.15), for `vtc` and for `vtc` with prices (input 0.5, output 3 per token: prices of one model
must not move the shares). With 8 streams each, most of a user's requests sit in the engine (running or
in its waiting queue), so its flow here is often empty; `vtc`'s return grace and bounded lift keep the short user's
share then (see `VirtualTokenCounterFairness`). Round robin, the 20:1 reference, runs one 60 s window only.

Wall time: 2 x (45 s warm-up + 300 s) + (45 s + 60 s) + start-ups: about 14 minutes (was about 3).
The engine alone is not run: its FIFO counts requests just as `round_robin` does.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.configs import STANDARD_CLASS, for_engine
from bench.engines import Engine, EngineProvider, SimProfile, SimProvider
from bench.product import VTC_RETURN_GRACE
from bench.records import RequestRecord, cumulative_tokens, mean_running, percentile, return_gaps, tokens_by_user
from bench.results import ScenarioResult, Table, Target
from bench.runner import ConfigBuilder, Mode, RunContext, run_modes
from bench.scenario import Definition, Options, Plot, Scenario
from bench.scenarios.common import errors, not_run, number, raw_figures, token_series
from bench.scenarios.workloads import measuring_window

TITLE = "token fairness"
LONG, SHORT = "long", "short"
CUMULATIVE = f"|tokens {LONG} ÷ tokens {SHORT} - 1|, cumulative"


@dataclass(frozen=True)
class S4Params:
    long_tokens: int = 1000  # the long user's answers
    short_tokens: int = 50  # the short user's answers (20:1)
    long_concurrency: int = 8  # closed-loop streams of each user
    short_concurrency: int = 8
    max_num_seqs: int = 8  # the engine's slots
    warmup_lifetimes: float = 2.0  # warm-up, in long-request lifetimes after the first token
    window: float = 300.0  # the measured run, seconds after the warm-up
    slice: float = 60.0  # every window of this length within the run is measured ...
    slide: float = 5.0  # ... starting every `slide` seconds
    reference_window: float = 60.0  # round robin, the 20:1 reference, is measured this long only
    timeout: float = 60.0


PRICES = {"input_token_cost": 0.5, "output_token_cost": 3.0}  # the priced run: any prices, same shares


def config(policy: str, model_extra: dict[str, Any] | None = None) -> ConfigBuilder:
    """A builder of the config for `policy` (and the model's extra keys, such as prices)."""

    def build(engine: Engine) -> dict[str, Any]:
        return for_engine(engine, fairness=policy, classes=STANDARD_CLASS, model_extra=model_extra)

    return build


def modes() -> list[Mode]:
    return [
        Mode("scheduler, round_robin", config=config("round_robin")),
        Mode("scheduler, vtc", config=config("vtc")),
        Mode("scheduler, vtc, priced", config=config("vtc", PRICES)),
    ]


def _is_reference(label: str) -> bool:
    return "round_robin" in label


RETURN_GRACE = VTC_RETURN_GRACE  # the shipped default: a slower return forfeits the place


def window_starts(start: float, end: float, p: S4Params) -> list[float]:
    """Where every `p.slice`-second window of [start, end) starts, one every `p.slide` s."""
    starts = []
    t = start
    while t + p.slice <= end + 1e-9:
        starts.append(t)
        t += p.slide
    return starts


def window_ratios(records: Sequence[RequestRecord], start: float, end: float, p: S4Params) -> list[float]:
    """long ÷ short in every `p.slice`-second window of [start, end), one starting every `p.slide` s."""
    ratios = []
    for t in window_starts(start, end, p):
        tokens = tokens_by_user(records, t, t + p.slice)
        ratios.append(tokens.get(LONG, 0) / max(1, tokens.get(SHORT, 0)))
    return ratios


def turnaround(records: Sequence[RequestRecord], start: float, end: float, p: S4Params) -> dict[str, Any]:
    """The clients' side of each window: how long each user's streams took to send again after an answer
    (a return slower than the grace hands the freed engine place to the other user for a whole lifetime),
    and how many requests of each user streamed on average. This is what tells a policy's excursion from
    a load generator that could not keep its user backlogged."""
    gaps = {user: [(t, g) for t, g in series if start <= t < end] for user, series in return_gaps(records).items()}
    summary = {
        user: {
            "returns": len(series),
            "p50_ms": 1000 * (percentile([g for _, g in series], 50) or 0.0),
            "p99_ms": 1000 * (percentile([g for _, g in series], 99) or 0.0),
            "max_ms": 1000 * max((g for _, g in series), default=0.0),
            "over_grace": sum(1 for _, g in series if g > RETURN_GRACE),
        }
        for user, series in gaps.items()
    }
    windows = []
    for t in window_starts(start, end, p):
        running = mean_running(records, t, t + p.slice)
        late = {
            user: sum(1 for when, g in series if t <= when < t + p.slice and g > RETURN_GRACE)
            for user, series in gaps.items()
        }
        windows.append(
            {
                "running": {user: round(n, 2) for user, n in running.items()},
                "returns_over_grace": late,
            }
        )
    return {"return_gaps": summary, "windows": windows}


async def body(run: RunContext, p: S4Params, window: float, warmup: float) -> dict[str, Any]:
    run.probe.start()
    stop = asyncio.Event()
    for i in range(max(p.long_concurrency, p.short_concurrency)):  # interleaved, so neither arrives first
        if i < p.long_concurrency:
            run.closed_loop(LONG, "backlog", 1, p.long_tokens, f"L{i}", stop)
        if i < p.short_concurrency:
            run.closed_loop(SHORT, "backlog", 1, p.short_tokens, f"S{i}", stop)
    start, end, engine_rate = await measuring_window(run, warmup, window, p.timeout)
    stop.set()
    tokens = tokens_by_user(run.records, start, end)
    ratios = window_ratios(run.records, start, end, p)
    return {
        "tokens": tokens,
        "engine_tokens_per_s": engine_rate,
        "long_over_short": tokens.get(LONG, 0) / max(1, tokens.get(SHORT, 0)),
        "window_ratios": ratios,
        "worst_window": max((abs(r - 1) for r in ratios), default=None),
        "window": [start, end],
        "clients": turnaround(run.records, start, end, p),
        "errors": errors(run.records),
        "_cumulative": cumulative_tokens(run.records, 0.25, end + 1.0),
    }


def cumulative_target(label: str, r: dict[str, Any], p: S4Params, within: float, fail_at: float) -> Target:
    """|long ÷ short - 1| over the whole window (S4's, and C4's with its own bound)."""
    wanted = f"within {within:.0%} of equal over {p.window:g} s"
    return Target.at_most(CUMULATIVE, wanted, label, abs(r["long_over_short"] - 1), within, fail_at, "%")


def worst_window_target(label: str, r: dict[str, Any], p: S4Params) -> Target:
    """|long ÷ short - 1| in the worst `p.slice`-second window."""
    figure, wanted = f"|tokens {LONG} ÷ tokens {SHORT} - 1|, worst {p.slice:g} s window", f"every {p.slice:g} s window"
    return Target.at_most(figure, f"within 15% of equal in {wanted}", label, r["worst_window"], 0.15, 0.25, "%")


def workload(p: S4Params, warmup: float, how: str) -> str:
    """The workload's description (S4's, and C4's: `how` says what it adds)."""
    return (
        f"user '{LONG}' keeps {p.long_concurrency} requests of {p.long_tokens} output tokens outstanding, user "
        f"'{SHORT}' {p.short_concurrency} of {p.short_tokens}, on {p.max_num_seqs} engine slots{how}; output tokens "
        f"counted over {p.window:g} s after a {warmup:.0f} s warm-up ({p.warmup_lifetimes:g} long lifetimes) from "
        f"the first token, cumulatively and in every {p.slice:g} s window ({p.slide:g} s apart)"
    )


def table_columns(p: S4Params) -> list[str]:
    """S4's table (C4 adds its own columns after these)."""
    return [
        "run",
        f"tokens {LONG}",
        f"tokens {SHORT}",
        f"{LONG} ÷ {SHORT}",
        f"worst {p.slice:g} s window",
        "engine tokens/s",
    ]


def table_row(label: str, r: dict[str, Any]) -> list[str]:
    """One run's row of S4's table: tokens per user, their ratio, the worst window's ratio, engine tokens/s."""
    ratios = r["window_ratios"]
    worst = max(ratios, key=lambda x: abs(x - 1)) if ratios else None
    return [
        label,
        number(r["tokens"].get(LONG, 0)),
        number(r["tokens"].get(SHORT, 0)),
        f"{r['long_over_short']:.2f}",
        "-" if worst is None else f"{worst:.2f}",
        number(r["engine_tokens_per_s"]),
    ]


async def run(
    provider: EngineProvider, options: Options | None = None, p: S4Params | None = None
) -> list[ScenarioResult]:
    p = p or S4Params()
    step = SimProfile().step_seconds(p.max_num_seqs)
    if isinstance(provider, SimProvider):
        provider = SimProvider(dataclasses.replace(provider.profile, max_num_seqs=p.max_num_seqs))
        step = provider.profile.step_seconds(p.max_num_seqs)
    warmup = p.warmup_lifetimes * p.long_tokens * step  # a long request's lifetime: one token per full step
    text = workload(p, warmup, "") + f"; round robin, the reference, over {p.reference_window:g} s"

    def measure(r: RunContext) -> Awaitable[dict[str, Any]]:
        window = p.reference_window if _is_reference(r.mode.label) else p.window
        return body(r, p, window, warmup)

    runs, skipped = await run_modes(provider, modes(), measure, timeout=warmup + p.window + p.timeout)
    if not runs:
        return [ScenarioResult.unavailable("S4", TITLE, text, "; ".join(not_run(skipped)))]
    result = ScenarioResult("S4", TITLE, text, provider.describe(), notes=not_run(skipped))
    result.table = Table(table_columns(p))
    for label, r in runs.items():
        result.table.rows.append(table_row(label, r))
        if _is_reference(label):
            continue
        result.targets += [cumulative_target(label, r, p, 0.05, 0.10), worst_window_target(label, r, p)]
    result.notes.append(
        f"Request-count fairness is expected near {p.long_tokens / p.short_tokens:.0f}:1 once the batch has "
        "settled (round robin: the reference the token-cost results are measured against, not a target)."
    )
    result.notes.append(f"The priced run charges {PRICES} per token: prices must not change the shares of one model.")
    result.raw, result.series = raw_figures(runs), token_series(runs)
    return [result]


_P = S4Params()
DEFINITION = Definition(
    id="S4",
    title=TITLE,
    question="Does a user with long answers get the same tokens as a user with short ones, not 20 times more?",
    workload=f"user long asks for {_P.long_tokens}-token answers and user short for {_P.short_tokens}-token "
    f"answers, {_P.long_concurrency} closed-loop streams each, prompts of a few tokens",
    layout=f"the simulator with {_P.max_num_seqs} slots; the scheduler with vtc, and with vtc and prices (input "
    f"{PRICES['input_token_cost']:g}, output {PRICES['output_token_cost']:g} per token); round_robin (the "
    f"20:1 reference) for {_P.reference_window:g} s",
    measures=f"|long ÷ short - 1| of output tokens after a warm-up of {_P.warmup_lifetimes:g} long lifetimes, "
    f"cumulatively over {_P.window:g} s and in every {_P.slice:g} s window (one starting every {_P.slide:g} s)",
    targets=("cumulative <= 0.05", "worst window <= 0.15"),
    duration="about 13 minutes",
    facts=(
        "Counting requests (round_robin, or the engine's FIFO) gives the long-answer user about 20 times the "
        "tokens, because each of its requests holds a slot 20 times longer.",
        "With 8 streams a user, most of its requests sit in the engine (running or waiting there), so its queue "
        "in the scheduler is often empty: vtc's return grace (scheduling.vtc_return_grace_seconds) and its "
        "bounded lift keep the share of a user whose requests just ended.",
        "The worst window is the first after the warm-up, with the long user under-served: the idle engine's "
        "first fill is arrival order, not a choice, and the engine's FIFO then starts the long requests that "
        "waited; vtc repays that head start as long answers end. No fairness policy can take back a slot an "
        "engine without priorities has already given.",
        "Prices move every user's cost alike, so they do not move the shares.",
    ),
    headline=(CUMULATIVE,),
)
SCENARIO = Scenario(
    (DEFINITION,),
    run,
    plots=(Plot("tokens", "s4_tokens.png", "S4: output tokens per user, 1000-token vs 50-token answers"),),
)

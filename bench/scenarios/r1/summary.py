"""R1's result for one layout and workload over its rounds: each setup's figures pooled over the rounds and
against the oracle's and FIFO's of the same rounds, as a table, notes and raw figures."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bench.results import ScenarioResult, Table
from bench.scenarios.common import divide, jsonable, median, seconds
from bench.scenarios.r1.figures import median_and_p90, nearest_rank, run_figures
from bench.scenarios.r1.gates import gate_summary
from bench.scenarios.r1.setups import SLOTS, Setup, Workload, result_suffix
from bench.scenarios.r1.targets import targets
from engines.layout import Layout


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _fmt_list(values: Sequence[float | None], fmt: Callable[[float | None], str]) -> str:
    return ", ".join(fmt(v) for v in values)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _decimal(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def summarise(
    engine: str, lay: Layout, workload: Workload, setups: list[Setup], rounds: list[dict[str, dict[str, Any]]]
) -> ScenarioResult:
    """The table, targets and notes for one layout and workload over all its rounds."""
    figs = [{key: run_figures(run) for key, run in rnd.items()} for rnd in rounds]
    title = f"{engine}, {lay.name}, {workload.name}{result_suffix(setups)}"
    result = ScenarioResult(f"R1 {title}", f"real engine, {lay.label}", workload.describe(), engine)
    oracle_key = "oracle" if any(s.key == "oracle" for s in setups) else None
    table = Table(
        [
            "setup",
            "latecomer TTFT median (per round)",
            "p90",
            "median ÷ oracle",
            "p90 ÷ oracle",
            "flood span ÷ FIFO (per round)",
            "tokens/s whole flood (window)",
            "slots full while work waits",
            "idle TTFT",
        ]
    )
    agg: dict[str, dict[str, Any]] = {}
    for setup in setups:
        per = [f[setup.key] for f in figs if setup.key in f]
        pooled = [t for p in per for t in p["late_ttft"]]
        paired = [f for f in figs if setup.key in f and "fifo" in f]  # the rounds with FIFO to compare against
        spans = [divide(f[setup.key]["span"], f["fifo"]["span"]) for f in paired]
        step_times = [divide(f[setup.key]["step_seconds"], f["fifo"]["step_seconds"]) for f in paired]
        # counted by the engine over each run's sampled window; span ÷ FIFO's is about the product of the two
        step_counts = [divide(f[setup.key]["steps"], f["fifo"]["steps"]) for f in paired]
        agg[setup.key] = {
            "median": median(pooled),
            "p90": nearest_rank(pooled, 0.9),
            "round_medians": [median(p["late_ttft"]) for p in per],
            "span_ratios": spans,
            "span_ratio": median([s for s in spans if s is not None]),
            "spans": [p["span"] for p in per],
            "step_count_ratios": step_counts,
            "step_count_ratio": median([r for r in step_counts if r is not None]),
            "step_time_ratios": step_times,
            "step_time_ratio": median([r for r in step_times if r is not None]),
            "tokens_per_step": [p["tokens_per_step"] for p in per],
            "tps_flood": [p["tps_flood"] for p in per],
            "tps_window": [p["tps_window"] for p in per],
            "full_share": median([p["full_share"] for p in per if p["full_share"] is not None]),
            "full_shares": [p["full_share"] for p in per],
            "starved_shares": [p["starved_share"] for p in per],
            "between_steps_shares": [p["between_steps_share"] for p in per],
            "ends_apart": [p["ends_apart"] for p in per],
            "first_fill_spreads": [p["first_fill_spread"] for p in per],
            "idle": median([p["idle_ttft"] for p in per if p["idle_ttft"] is not None]),
            "decode": median([p["decode"] for p in per if p["decode"] is not None]),
            "missing": sum(p["late_missing"] for p in per),
            "after_flood": sum(p["late_after_flood"] for p in per),
            "errors": sorted({e for p in per for e in p["errors"]}),
            "n": len(pooled),
            "turnover_waits": [p["turnover_wait"] for p in per],
            **median_and_p90("path", [t for p in per for t in p["late_path"]]),
            **median_and_p90("hop", [t for p in per for t in p["late_hop"]]),
            **median_and_p90("queue_wait", [t for p in per for t in p["late_queue_wait"]]),
            **median_and_p90("intake", [t for p in per for t in p["late_intake"]]),
            "cpu": {
                role: median([p["cpu"][role] for p in per if role in p["cpu"]])
                for role in sorted({role for p in per for role in p["cpu"]})
            },
        }
    oracle = agg.get(oracle_key) if oracle_key else None
    for setup in setups:
        a = agg[setup.key]
        med_ratio = divide(a["median"], oracle["median"]) if oracle else None
        p90_ratio = divide(a["p90"], oracle["p90"]) if oracle else None
        a["median_vs_oracle"], a["p90_vs_oracle"] = med_ratio, p90_ratio
        table.rows.append(
            [
                setup.label,
                f"{seconds(a['median'])} ({_fmt_list(a['round_medians'], seconds)}; n={a['n']})",
                seconds(a["p90"]),
                _x(med_ratio),
                _x(p90_ratio),
                f"{_x(a['span_ratio'])} ({_fmt_list(a['span_ratios'], _x)})",
                f"{_fmt_list(a['tps_flood'], lambda v: '-' if v is None else f'{v:.0f}')} "
                f"({_fmt_list(a['tps_window'], lambda v: '-' if v is None else f'{v:.0f}')})",
                f"{_fmt_list(a['full_shares'], lambda v: '-' if v is None else f'{v:.0%}')}",
                seconds(a["idle"]),
            ]
        )
        if a["path"] is not None:
            result.notes.append(
                f"{setup.label}: next free slot {_fmt_list(a['turnover_waits'], seconds)} after a random moment "
                f"of the latecomers' window (median per round: how often the engine turned a slot over); first "
                f"token {seconds(a['path'])} (p90 {seconds(a['path_p90'])}) after the first slot that freed once "
                "a latecomer was sent (the path)"
            )
        if a["hop"] is not None:
            result.notes.append(
                f"{setup.label}: a latecomer's time to first token at its client minus at the scheduler (from "
                f"admitting it): {seconds(a['hop'])} (p90 {seconds(a['hop_p90'])}), the request's way in and its "
                f"first token's way out through the scheduler; held in the scheduler's queue "
                f"{seconds(a['queue_wait'])} (p90 {seconds(a['queue_wait_p90'])})"
            )
        if a["intake"] is not None:
            result.notes.append(
                f"{setup.label}: the engine's front end took a latecomer's request in (from its sending to the "
                f"engine's response headers) in {seconds(a['intake'])} (p90 {seconds(a['intake_p90'])}); one "
                "that arrives after a slot turned over waits for the next turnover"
            )
        if any(a["tokens_per_step"]):
            result.notes.append(
                f"{setup.label}: the engine's own step count over the flood ÷ FIFO's {_x(a['step_count_ratio'])} "
                f"({_fmt_list(a['step_count_ratios'], _x)}), time per step ÷ FIFO's {_x(a['step_time_ratio'])} "
                f"({_fmt_list(a['step_time_ratios'], _x)}): span ÷ FIFO's is about their product; output tokens per "
                f"step (the engine's mean batch) {_fmt_list(a['tokens_per_step'], _decimal)}"
            )
        if any(a["starved_shares"]):
            result.notes.append(
                f"{setup.label}: slots empty with nothing waiting at the engine while clients' work was queued "
                f"(held back before the engine), share of samples per round: "
                f"{_fmt_list(a['starved_shares'], _percent)}"
            )
        if any(share is not None for share in a["between_steps_shares"]):
            result.notes.append(
                f"{setup.label}: slots read short while the engine itself held waiting work (a finish read "
                "before the engine's next step admits a waiting request), share of samples "
                f"per round: {_fmt_list(a['between_steps_shares'], _percent)}; ends out of a step of their own: "
                f"{_fmt_list(a['ends_apart'], _percent)} of all (each one such reading); the flood's first "
                f"{SLOTS} first tokens spread over {_fmt_list(a['first_fill_spreads'], seconds)} (the slots' phases)"
            )
        if a["cpu"]:
            shares = ", ".join(f"{role} {value:.1f}" for role, value in a["cpu"].items() if value is not None)
            result.notes.append(f"{setup.label}: CPU seconds per run by role (median over rounds): {shares}")
        if a["after_flood"]:
            result.notes.append(f"{setup.label}: {a['after_flood']} latecomers sent after the flood's last token")
        if a["missing"] or a["errors"]:
            result.notes.append(f"{setup.label}: {a['missing']} latecomers without a token; errors {a['errors']}")
    result.table = table
    targets(result, lay, setups, agg)
    gate_runs = {
        setup.key: [gate_summary(rnd[setup.key]) for rnd in rounds if setup.key in rnd]
        for setup in setups
        if setup.scheduled
    }
    result.raw = {"aggregate": jsonable(agg), "rounds": jsonable(figs), "gates": jsonable(gate_runs)}
    result.series = {
        "runs": [
            {
                key: {
                    "records": [r.summary() for r in run["records"]],
                    "engine": [[s.t, s.waiting, s.running, s.generated, s.steps] for s in run["engine"]],
                    "gates": run["gates"],
                }
                for key, run in rnd.items()
            }
            for rnd in rounds
        ]
    }
    return result

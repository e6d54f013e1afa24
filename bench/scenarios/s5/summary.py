"""S5's result: the runs' table, their targets against the idle baseline, and the TPOT flood's targets."""

from __future__ import annotations

from typing import Any

from bench.results import ScenarioResult, Table, Target
from bench.scenarios.common import divide, jsonable, ms, not_run, number, seconds, share, ttft_series, with_requests
from bench.scenarios.s5.setups import DIRECT_FIFO, DIRECT_PRIORITY, IDLE_BASELINE, TITLE, TPOT_LIMIT, S5Params
from bench.scenarios.s5.tpot_flood import SLOW_STEPPING, TPOT_TOLERANCE, FloodStats


def summarise(runs: dict[str, dict[str, Any]], skipped: dict[str, str], workload: str, engine: str) -> ScenarioResult:
    """The result of S5's runs: a row per run (the engine-alone runs first), the scheduled runs' targets,
    each run's interactive p99 against an idle engine, the raw figures and the plots' series."""
    result = ScenarioResult("S5", TITLE, workload, engine, notes=not_run(skipped))
    result.table = Table(
        [
            "run",
            "idle TTFT",
            "interactive TTFT p50 / p99",
            "interactive TPOT p50 / p99",
            "batch tokens/s during / after",
            "batch completed",
            "batch done at",
        ]
    )
    direct = runs.get(DIRECT_FIFO)
    baseline = runs.get(IDLE_BASELINE)
    baseline_p99 = baseline["interactive"]["ttft_p99"] if baseline is not None else None
    order = [DIRECT_FIFO, DIRECT_PRIORITY, IDLE_BASELINE]
    runs = dict(sorted(runs.items(), key=lambda item: order.index(item[0]) if item[0] in order else len(order)))
    for label, r in runs.items():
        lat = r["interactive"]
        result.table.rows.append(
            [
                label,
                seconds(r["idle_ttft"]),
                f"{seconds(lat['ttft_p50'])} / {seconds(lat['ttft_p99'])}",
                f"{ms(lat['tpot_p50'], 0)} / {ms(lat['tpot_p99'], 0)}",
                f"{number(r['batch_tokens_per_s_during'])} / {number(r['batch_tokens_per_s_after'])}",
                share(r["batch_completed"]),
                seconds(r["batch_done_at"]),
            ]
        )
        if label.startswith("scheduler"):
            targets(result, label, r, direct, baseline_p99)
        p99 = lat["ttft_p99"]
        if p99 is not None and r["idle_ttft"]:
            versus_baseline = f", {p99 / baseline_p99:.2f} x the idle baseline's p99" if baseline_p99 else ""
            result.notes.append(
                f"{label}: interactive TTFT p99 {seconds(p99)} = {p99 / r['idle_ttft']:.2f} x one request alone on "
                f"the idle engine{versus_baseline}."
            )
    result.raw = {label: with_requests(r) for label, r in runs.items()}
    result.series = ttft_series(runs)
    return result


def tpot_targets(result: ScenarioResult, flood: FloodStats, p: S5Params) -> None:
    """The TPOT hold: engine mean TPOT at most 1.1x the limit, the batch no smaller than the limit's minus one."""
    label = "scheduler, interactive flood on the slow-stepping engine"
    result.notes.append(
        f"{label}: {p.tpot_flood_requests} interactive streams of {p.tpot_flood_tokens} tokens from "
        f"{p.tpot_flood_users} users, engine with {SLOW_STEPPING['max_num_seqs']:g} slots and a step of "
        f"{SLOW_STEPPING['decode_base_ms']:g} ms + {SLOW_STEPPING['decode_per_seq_ms']:g} ms per running request: "
        f"{flood.describe(TPOT_LIMIT)}."
    )
    result.raw["tpot flood"] = jsonable({k: v for k, v in vars(flood).items()})
    limit = f"at most {TPOT_TOLERANCE:g} x the class limit ({TPOT_LIMIT * 1000:.0f} ms)"
    held = f"{limit}; p90 {ms(flood.p90_tpot, 0)}, {number(flood.tokens_per_s)} tokens/s"
    tpot, tolerance = flood.mean_tpot, TPOT_TOLERANCE * TPOT_LIMIT
    result.targets.append(
        Target.at_most("engine mean TPOT over the flood", held, label, tpot, tolerance, 1.2 * TPOT_LIMIT, " s")
    )
    need = flood.limit_batch(TPOT_LIMIT) - 1
    kept = f">= the limit's batch minus one ({need}; nominal 10 of 16)"
    batch = flood.mean_running_queued
    result.targets.append(Target.at_least("engine mean running batch while queued", kept, label, batch, need, need - 1))


def targets(
    result: ScenarioResult,
    label: str,
    r: dict[str, Any],
    direct: dict[str, Any] | None,
    baseline_p99: float | None,
) -> None:
    """TTFT against the idle baseline's p99 (without that run, against 2x one request alone on the idle
    engine, the engine's own limit: see the module docstring), TPOT and batch completion."""
    lat = r["interactive"]
    if baseline_p99:
        bound, target = (
            2 * baseline_p99,
            f"<= 2 x idle: the same arrivals without the flood, p99 {seconds(baseline_p99)}",
        )
    else:
        bound, target = 2 * (r["idle_ttft"] or 0.0), "<= 2 x idle TTFT of one request alone"
    under = f"under the class limit ({TPOT_LIMIT * 1000:.0f} ms)"
    completes = "batch still completes when interactive is idle"
    result.targets += [
        Target.at_most("interactive TTFT p99", target, label, lat["ttft_p99"], bound, bound * 1.25, " s"),
        Target.at_most("interactive TPOT p99", under, label, lat["tpot_p99"], TPOT_LIMIT, TPOT_LIMIT * 1.1, " s"),
        Target.at_least("batch requests completed", completes, label, r["batch_completed"], 1.0, 0.999, "%"),
    ]
    if direct is not None:
        result.notes.append(
            f"{label}: batch tokens/s after the interactive phase = "
            f"{share(divide(r['batch_tokens_per_s_after'], direct['batch_tokens_per_s_after']))} of the engine alone."
        )

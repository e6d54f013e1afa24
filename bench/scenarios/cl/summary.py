"""CL's and CN's results: each layout's CPU per request of leaders and followers with Redis's cost, and each
load step of the one leader against the follower's own CPU per request."""

from __future__ import annotations

from typing import Any

from bench.results import ScenarioResult, Table, Target
from bench.scenarios.cl.load import sustained
from bench.scenarios.cl.setups import ID, LOAD_ID, LOAD_TITLE, TARGET, TITLE, CLParams
from bench.scenarios.common import divide, jsonable, ms, not_run, number, share


def cluster_result(
    runs: dict[str, dict[str, Any]], skipped: dict[str, str], workload: str, engine: str
) -> ScenarioResult:
    if not runs:
        return ScenarioResult.unavailable(ID, TITLE, workload, "; ".join(not_run(skipped)))
    result = ScenarioResult(ID, TITLE, workload, engine, notes=not_run(skipped))
    result.table = Table(
        [
            "run",
            "requests",
            "follower CPU / request",
            "leader CPU / request (each leader)",
            "leaders ÷ followers",
            "Redis commands / request",
            "Redis CPU / request",
            "Redis CPU / command",
        ]
    )
    for label, r in runs.items():
        each = ", ".join(
            f"r{x['replica'] + 1} ({'+'.join(x['models'])}): {ms(x['cpu_per_request'], 3)}" for x in r["leaders"]
        )
        result.table.rows.append(
            [
                label,
                str(r["requests"]),
                ms(r["follower_cpu_per_request"], 3),
                each,
                "-" if r["leader_over_follower"] is None else f"{r['leader_over_follower']:.1%}",
                number(r["redis_commands_total_per_request"], 1),
                ms(r["redis_cpu_per_request"], 3),
                "-" if r["redis_cpu_per_command"] is None else f"{r['redis_cpu_per_command'] * 1e6:.1f} us",
            ]
        )
        models = sum(len(x["models"]) for x in r["leaders"])
        if models > 1:
            result.targets.append(
                Target(
                    "replicas leading the models' decisions (one lease per model)",
                    f"= {models}, one per model",
                    label,
                    float(len(r["leaders"])),
                    threshold=float(models),
                    fail_at=float(models) - 0.5,
                )
            )
    for label, r in runs.items():
        commands = ", ".join(f"{k} {v:.2f}" for k, v in r["redis_commands_per_request"].items())
        messages = ", ".join(f"{k} {v:.2f}" for k, v in r["messages_per_request"].items())
        result.notes.append(f"{label}: Redis commands per request: {commands}; messages per request: {messages}.")
    result.notes.append(
        "CPU figures are each process's CPU time over the load window (from the first request sent until the last "
        "one ended) minus its idle rate over an idle window as long just before (heartbeats, scrapes). Redis: its "
        "main thread's CPU (INFO cpu). All processes share this machine's cores with the load generator."
    )
    result.notes.append(
        "At this light load nearly every message is a Redis round trip of its own at each end; a busy leader reads "
        "and writes many per round trip, so its CPU per request falls with the load (CN measures it there)."
    )
    result.raw = {label: jsonable(r) for label, r in runs.items()}
    return result


def load_result(
    load: dict[str, Any] | None,
    follower_cpu: float | None,
    p: CLParams,
    failed: str,
    workload: str,
) -> ScenarioResult:
    if load is None:
        return ScenarioResult.unavailable(LOAD_ID, LOAD_TITLE, workload, failed or "-")
    result = ScenarioResult(LOAD_ID, LOAD_TITLE, workload, "instant fake engine (bench/servers/fake_engine.py)")
    result.table = Table(
        [
            "offered",
            "ended",
            "Admit -> Grant p50 / p99",
            "leader CPU / request",
            "leader core share",
            "÷ follower CPU / request (CL)",
            "Redis commands / request",
            "Redis CPU / request",
            "driver CPU",
        ]
    )
    for step in load["steps"]:
        result.table.rows.append(
            [
                f"{step['rate']:g} req/s",
                f"{step['ended']} / {step['admitted']}",
                f"{ms(step['grant_latency_p50'], 1)} / {ms(step['grant_latency_p99'], 1)}",
                ms(step["leader_cpu_per_request"], 3),
                "-" if step["leader_core_share"] is None else f"{step['leader_core_share']:.0%}",
                share(divide(step["leader_cpu_per_request"], follower_cpu)),
                number(step["redis_commands_per_request"], 1),
                ms(step["redis_cpu_per_request"], 3),
                f"{step['driver_cpu']:.2f} s",
            ]
        )
    best = sustained(load, p)
    followers = None if best is None or follower_cpu is None else best["rate"] * follower_cpu
    result.targets.append(
        Target(
            "leader CPU per follower-owned request ÷ the follower's own CPU for it, at the highest sustained step",
            f"<= {TARGET:.0%} (one leader serves at least ten followers)",
            "one leader" if best is None else f"one leader at {best['rate']:g} req/s",
            None if best is None else divide(best["leader_cpu_per_request"], follower_cpu),
            threshold=TARGET,
            fail_at=1.5 * TARGET,
            higher_is_better=False,
            unit="%",
        )
    )
    result.notes.append(
        f"The follower's own CPU per request comes from CL's one-model run in the same bench run "
        f"({ms(follower_cpu, 3)}); a sustained step ended every request with a median Admit -> Grant under "
        f"{p.sustained_latency * 1000:.0f} ms. The highest sustained step carries "
        + ("-" if followers is None else f"{followers:.1f}")
        + " followers' worth of requests (its rate times the follower's CPU per request: busy cores of "
        "followers). Leader CPU is its process's CPU minus its idle rate (8 backends scraped every 0.1 s: "
        f"{load['leader_idle_cpu_per_second']:.0%} of a core); Redis: its main thread's CPU (INFO cpu) minus its "
        "idle rate, and every command it ran (the driver's too)."
    )
    result.raw = jsonable(load)
    return result

"""S9's result: the decision cost per backlog size in the table; every policy and mode, the day (vtc against
FIFO) and the memory in the notes; the targets when the run was at full size."""

from __future__ import annotations

from typing import Any

from bench.results import ScenarioResult, Table, Target
from bench.scenarios.common import divide, number, ratio, seconds, share
from bench.scenarios.s9.parts import S9Params

TITLE = "scale: ten thousand users, a hundred engines"
SMALL, LARGE = 10, 10_000


def workload_text(p: S9Params) -> str:
    d, m = p.day, p.memory
    return (
        f"decision cost: {', '.join(f'{u:,}' for u in p.users)} users backlogged over 3 classes, 100 backends of "
        f"one model, prefix_locality, {p.dispatches} dispatches each; day: {d.users:,} Zipf users, {d.engines} "
        f"engines over 3 models, {d.seconds:g} s simulated at {d.load:g}x the engines' capacity, vtc and FIFO on "
        f"the same arrivals; memory: {m.requests:,} requests from {m.users:,} users with {m.prompt_bytes} B prompts"
    )


def _cost(figures: dict[str, Any], users: int, baseline: bool = False) -> dict[str, Any] | None:
    return next((c for c in figures["decision_cost"] if c["users"] == users and c["baseline"] == baseline), None)


def build_result(figures: dict[str, Any], p: S9Params, *, targets: bool) -> ScenarioResult:
    result = ScenarioResult("S9", TITLE, workload_text(p), "in-process core, simulated engines")
    result.table = Table(
        ["users backlogged", "setup", "admission CPU", "dispatch CPU (median)", "p90", "all passes' CPU per dispatch"]
    )
    for c in figures["decision_cost"]:
        result.table.rows.append(
            [
                f"{c['users']:,}",
                "walks put back" if c["baseline"] else "shipped",
                f"{c['admission_us']:.1f} us",
                f"{c['dispatch_us_median']:.1f} us",
                f"{c['dispatch_us_p90']:.1f} us",
                f"{c['decision_us_per_dispatch']:.1f} us",
            ]
        )
    result.notes += _policy_notes(figures, p) + _day_notes(figures["day"]) + _memory_notes(figures["memory"])
    result.raw = figures
    if targets:
        result.targets = _targets(figures)
    return result


def _policy_notes(figures: dict[str, Any], p: S9Params) -> list[str]:
    small, large = (str(u) for u in p.policy_users)
    lines = []
    for row in figures["policies"]:
        a, b = row[small], row[large]
        mode = f"D-LPM window {row['deficit_bound']:g}" if row["deficit_bound"] else "no locality window"
        if row["groups"]:
            mode += f", users in {row['groups']} shared groups"
        growth = ratio(divide(b["dispatch_us_median"], a["dispatch_us_median"]), 2)
        lines.append(
            f"{row['policy']}, {mode}: median dispatch {a['dispatch_us_median']:.0f} us at {int(small):,} users, "
            f"{b['dispatch_us_median']:.0f} us at {int(large):,} ({growth})"
        )
    return lines


def _day_notes(runs: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for setup, r in runs.items():
        lines.append(
            f"day, {setup}: {r['arrived']:,} calls, {r['completed']:,} completed, {r['without_first_token']:,} "
            f"without a first token at the end; light users' TTFT p50 {seconds(r['ttft_light_p50'])}, p99 "
            f"{seconds(r['ttft_light_p99'])}; the heaviest user's share of its model's service "
            f"{share(r['heaviest_share'])} "
            f"against its fair share {share(r['heaviest_fair_share'])} ({ratio(r['heaviest_share_over_fair'], 2)}); "
            f"largest service difference of the checked pairs {number(r['largest_service_difference'])} against vtc's "
            f"bound {number(r['service_bound'])}; engine steps with every slot busy while work was queued "
            f"{share(r['full_step_share'])}; CPU per simulated request {r['cpu_us_per_request']:.0f} us (the core's "
            f"decisions {r['decision_cpu_us_per_request']:.0f} us); {r['wall_seconds']:.0f} s wall"
        )
    vtc, fifo = runs.get("vtc"), runs.get("FIFO")
    if vtc and fifo:
        p50 = ratio(divide(vtc["ttft_light_p50"], fifo["ttft_light_p50"]), 2)
        p99 = ratio(divide(vtc["ttft_light_p99"], fifo["ttft_light_p99"]), 2)
        lines.append(f"vtc against FIFO: light users' TTFT p50 {p50}, p99 {p99}")
    return lines


def _memory_notes(m: dict[str, Any]) -> list[str]:
    return [
        f"memory: {m['requests']:,} requests queued from {m['users']:,} users with {m['prompt_bytes']} B prompts: "
        f"resident {m['rss_after'] / 1e6:.0f} MB ({m['rss_after'] / 2**20:.0f} MiB; {m['rss_before'] / 1e6:.0f} MB "
        f"before the first), {m['bytes_per_request']:.0f} B per queued request, {m['bytes_beyond_prompt']:.0f} B "
        "beyond its prompt"
    ]


def _targets(figures: dict[str, Any]) -> list[Target]:
    small, large = _cost(figures, SMALL), _cost(figures, LARGE)
    growth = divide(large["dispatch_us_median"], small["dispatch_us_median"]) if small and large else None
    median = large["dispatch_us_median"] if large else None
    day = figures["day"]
    wall = max((r["wall_seconds"] for r in day.values()), default=None)
    vtc = day.get("vtc")
    held = divide(vtc["largest_service_difference"], vtc["service_bound"]) if vtc else None
    rss = figures["memory"]["rss_after"] / 1e6
    return [
        Target.at_most("dispatch CPU at 10,000 users ÷ at 10", "<= 2x", "shipped", growth, 2.0, 2.5, unit="x"),
        Target.at_most("median dispatch CPU at 10,000 users (us)", "< 100 us", "shipped", median, 100, 150),
        Target.at_most(
            "wall time of the simulated hour (slower setup)", "<= 10 min", "vtc, FIFO", wall, 600, 720, unit=" s"
        ),
        Target.at_most("vtc's largest service difference ÷ its bound", "<= 1", "vtc", held, 1.0, 1.0, unit="x"),
        Target.at_most("resident memory with 100,000 queued (MB)", "<= 300 MB", "vtc", rss, 300, 330),
    ]

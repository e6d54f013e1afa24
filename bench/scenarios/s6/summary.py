"""S6's result: the rounds' latency figures side by side, the added latency against the echo's round trip,
the HTTP door against the gRPC door, the ceiling and the scheduler's CPU per request."""

from __future__ import annotations

from typing import Any

from bench.results import ScenarioResult, Table, Target
from bench.scenarios.common import divide, jsonable, median, minus, ms, not_run, number
from bench.scenarios.s6.setups import DIRECT, ECHO, HTTP, HTTP_RATIO, SCHEDULED, TITLE, S6Params

Rounds = list[dict[str, dict[str, Any]]]


def summarise(rounds: Rounds, skipped: dict[str, str], p: S6Params, workload: str, engine: str) -> ScenarioResult:
    """The result of S6's rounds: each run's figures per phase, what the scheduler and each door added,
    the targets, the ceiling and the CPU per request."""
    result = ScenarioResult("S6", TITLE, workload, engine, notes=not_run(skipped))
    result.table = Table(["run", "rate (sent / offered)", "latency p50", "latency p99", "TTFT p50", "TTFT p99"])
    figures = ("latency_p50", "latency_p99", "ttft_p50", "ttft_p99")
    with_http = [r for r in rounds if HTTP in r]
    for phase in ("low", "target"):
        for label in (DIRECT, ECHO, SCHEDULED, HTTP):
            xs = [r[label][phase] for r in rounds if label in r]
            if not xs:
                continue
            sent = median([x["sent_rate"] for x in xs])
            result.table.rows.append(
                [label, f"{number(sent)} / {xs[0]['offered_rate']:g} req/s", *(_spread(xs, f) for f in figures)]
            )
        added = [{f: minus(r[SCHEDULED][phase][f], r[DIRECT][phase][f]) for f in figures} for r in rounds]
        offered = rounds[0][DIRECT][phase]["offered_rate"]
        result.table.rows.append(
            [f"**added by the scheduler** at {offered:g} req/s", "", *(_spread(added, f) for f in figures)]
        )
        if with_http:
            added_http = [{f: minus(r[HTTP][phase][f], r[DIRECT][phase][f]) for f in figures} for r in with_http]
            result.table.rows.append(
                [
                    f"**added through the HTTP door** at {offered:g} req/s",
                    "",
                    *(_spread(added_http, f) for f in figures),
                ]
            )
        echo = [{f: _times(2.0, r[ECHO][phase][f]) for f in figures} for r in rounds]
        result.table.rows.append(
            [f"2x the echo's round trip at {offered:g} req/s", "", *(_spread(echo, f) for f in figures)]
        )
    added_p50 = median(
        [minus(r[SCHEDULED]["target"]["latency_p50"], r[DIRECT]["target"]["latency_p50"]) for r in rounds]
    )
    added_p99 = median(
        [minus(r[SCHEDULED]["target"]["latency_p99"], r[DIRECT]["target"]["latency_p99"]) for r in rounds]
    )
    echo_p50 = median([r[ECHO]["target"]["latency_p50"] for r in rounds])
    # "< 1 ms, or at most 2x a bare gRPC echo's round trip in the same run": whichever bound is looser
    bound = max(0.001, 2.0 * echo_p50) if echo_p50 is not None else 0.001
    rate = f"at {p.rate:g} requests/s"
    result.targets += [
        Target(
            "added latency p50",
            f"< 1 ms or at most 2x the bare gRPC echo's round trip (here {ms(bound)}) {rate}",
            SCHEDULED,
            added_p50,
            bound,
            1.5 * bound,
            False,
            " s",
        ),
        Target("added latency p99", f"< 5 ms {rate}", SCHEDULED, added_p99, 0.005, 0.0075, False, " s"),
    ]
    result.notes.append(
        f"Figures are medians over {len(rounds)} interleaved round(s), [min - max] beside them; the added latency is "
        "taken per round (scheduler minus engine alone of the same round), then its median. The echo "
        "(bench/servers/grpc_echo.py) is a separate grpc.aio process that answers the same client with the same four "
        "messages at once: the cost of one gRPC streaming hop on this machine."
    )
    if with_http:
        _http_door(result, with_http, p)
    ceilings = [r[SCHEDULED]["ceiling"] for r in rounds]
    ceiling_rate = median([c["rate"] for c in ceilings])
    cpu_share = median([c["scheduler_cpu_share"] for c in ceilings])
    cpu_per_request = median([c["scheduler_cpu_per_request"] for c in ceilings])
    direct_rate = median([r[DIRECT]["ceiling"]["rate"] for r in rounds])
    result.notes.append(
        f"Ceiling ({p.ceiling_concurrency} clients back to back): {number(ceiling_rate)} req/s through the "
        f"scheduler, {number(direct_rate)} req/s straight to the engine; the scheduler then used "
        f"{cpu_share or 0:.0%} of a core, {ms(cpu_per_request)} of CPU per request (so about "
        f"{number(divide(1.0, cpu_per_request))} req/s if it had a core to itself). Measured on 2 cores shared "
        "with the load generator, the engine and other users."
    )
    low_cpu = median([r[SCHEDULED]["low"]["scheduler_cpu_per_request"] for r in rounds])
    target_cpu = median([r[SCHEDULED]["target"]["scheduler_cpu_per_request"] for r in rounds])
    echo_cpu = median([r[ECHO]["target"]["scheduler_cpu_per_request"] for r in rounds])
    result.notes.append(
        f"Scheduler CPU per request: {ms(low_cpu)} at {p.low_rate:g} req/s, {ms(target_cpu)} at {p.rate:g} req/s; "
        f"the bare gRPC echo's at {p.rate:g} req/s: {ms(echo_cpu)} (the gRPC hop alone; the scheduler adds the HTTP "
        "client to the engine and its own work). Once CPU per request times the rate nears the core the scheduler "
        "gets, requests queue for the CPU and the added latency grows from milliseconds to hundreds of them."
    )
    result.raw = {"rounds": [{label: jsonable(r) for label, r in runs.items()} for runs in rounds]}
    return result


def added_ratio(rounds: list[dict[str, dict[str, Any]]], phase: str, door: str) -> tuple[float | None, ...]:
    """(median added latency p50 through `door`, through gRPC, their ratio) over the rounds that ran both;
    added = that door's p50 minus the engine alone's p50 of the same round. No ratio when gRPC's added
    latency is not positive (noise would make any ratio meaningless)."""
    both = [r for r in rounds if door in r and SCHEDULED in r and DIRECT in r]
    door_added = median([minus(r[door][phase]["latency_p50"], r[DIRECT][phase]["latency_p50"]) for r in both])
    grpc_added = median([minus(r[SCHEDULED][phase]["latency_p50"], r[DIRECT][phase]["latency_p50"]) for r in both])
    ratio = divide(door_added, grpc_added) if grpc_added is not None and grpc_added > 0 else None
    return door_added, grpc_added, ratio


def _http_door(result: ScenarioResult, rounds: list[dict[str, dict[str, Any]]], p: S6Params) -> None:
    """The HTTP door's target and notes: its added latency against the gRPC door's, same rounds."""
    http_added, grpc_added, ratio = added_ratio(rounds, "target", HTTP)
    low_http, low_grpc, low_ratio = added_ratio(rounds, "low", HTTP)
    result.targets.append(
        Target(
            "added latency p50, HTTP door ÷ gRPC door",
            f"<= {HTTP_RATIO:g}x the gRPC door's at {p.rate:g} requests/s (same rounds)",
            HTTP,
            ratio,
            HTTP_RATIO,
            2.0,
            False,
            "x",
        )
    )
    http_cpu = median([r[HTTP]["target"]["scheduler_cpu_per_request"] for r in rounds])
    grpc_cpu = median([r[SCHEDULED]["target"]["scheduler_cpu_per_request"] for r in rounds])
    low_text = "-" if low_ratio is None else f"{low_ratio:.2f}x"
    result.notes.append(
        f"HTTP door ({len(rounds)} round(s)): added latency p50 {ms(http_added)} against gRPC's {ms(grpc_added)} "
        f"at {p.rate:g} req/s, {ms(low_http)} against {ms(low_grpc)} ({low_text}) at {p.low_rate:g} req/s; each is "
        "the door's latency p50 minus the engine alone's of the same round (the same method for both doors: the "
        "engine-alone request is itself an HTTP/SSE request from the same aiohttp client, so the HTTP door's "
        "figure is the scheduler's work plus one more HTTP hop, gRPC's the scheduler's work plus a gRPC hop in "
        f"place of an HTTP one). Scheduler CPU per request at {p.rate:g} req/s: {ms(http_cpu)} by HTTP, "
        f"{ms(grpc_cpu)} by gRPC."
    )


def _spread(rows: list[dict[str, Any]], figure: str) -> str:
    """The median of a figure over the rounds, with its range when there is more than one round."""
    values = [v for v in (row[figure] for row in rows) if v is not None]
    if len(values) < 2:
        return ms(median(values))
    return f"{ms(median(values))} [{ms(min(values))} - {ms(max(values))}]"


def _times(factor: float, value: float | None) -> float | None:
    return None if value is None else factor * value

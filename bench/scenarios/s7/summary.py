"""S7's result: the three-way table, the targets (every count agrees, nothing lost or served twice, memory
within the caps' bound) and the notes."""

from __future__ import annotations

from typing import Any

from bench.results import ScenarioResult, Table, Target
from bench.scenarios.common import jsonable
from bench.scenarios.s7.params import OUTCOMES, RUN, TITLE, S7Params


def three_way(f: dict[str, Any]) -> Table:
    table = Table(["count", "clients", "scheduler", "engine (journal)"])
    states = ", ".join(f"{k} {v}" for k, v in sorted(f["engine_states"].items()))
    table.rows.append(["admitted", str(f["admitted"]["clients"]), str(f["admitted"]["scheduler"]), states])
    for outcome in OUTCOMES:
        engine = str(f["engine_completed"]) if outcome == "completed" else ""
        table.rows.append(
            [outcome, str(f["outcomes"]["clients"].get(outcome, 0)), str(f["outcomes"]["scheduler"][outcome]), engine]
        )
    table.rows.append(
        [
            "failed over (re-sent before a token; clients: after an engine took it)",
            str(f["failovers"]["clients"]),
            str(f["failovers"]["scheduler"]),
            "",
        ]
    )
    return table


def workload(p: S7Params) -> str:
    return (
        f"a flood of {p.max_tokens}-token streams from {p.flood_users} users at {p.flood_factor:g}x the engine's "
        f"capacity ({p.flood_factor * p.capacity():.0f} requests/s for {p.flood_seconds:g} s) with caps on "
        f"(max_queued {p.max_queued}, per user {p.max_queued_per_user}, max_prompt_bytes {p.max_prompt_bytes}, "
        f"max_queued_bytes {p.max_queued_bytes}, per user {p.max_queued_bytes_per_user}); engine SIGKILLed at "
        f"{p.kill_at:g} s and restarted; its metrics down {p.metrics_down_for:g} s from {p.metrics_down_at:g} s; "
        f"{p.queued_cancels} cancels while queued and {p.running_cancels} after the first token; {p.duplicates} "
        f"duplicate live request ids; {p.oversized} prompts over max_prompt_bytes"
    )


def summarise(f: dict[str, Any], p: S7Params, workload: str) -> ScenarioResult:
    """The result of one S7 run from its figures (`bench.scenarios.s7.analysis`)."""
    result = ScenarioResult("S7", TITLE, workload, p.profile().describe())
    result.table = three_way(f)
    bound = f["rss_bound_mb"]
    result.targets += [
        Target("outcome count mismatches (clients, scheduler, engine)", "0", RUN, f["outcome_mismatch"] + f["completed_mismatch"] + f["unterminated_at_engine"] + len(f["engine_served_not_admitted"]), 0, 0, False),  # noqa: E501
        Target("admitted requests lost (no outcome)", "0", RUN, f["lost"], 0, 0, False),
        Target("requests served twice", "0", RUN, f["served_twice"], 0, 0, False),
        # a client hears only of attempts an engine took (a second `dispatched`); one refused outright (the engine
        # down) is counted by the scheduler alone, so the clients' count is a floor for the scheduler's
        Target("failovers clients saw that the scheduler did not count", "0", RUN, max(0, f["failovers"]["clients"] - f["failovers"]["scheduler"]), 0, 0, False),  # noqa: E501
        Target("cancelled running requests not aborted at the engine", "0", RUN, f["running_cancels_not_aborted_count"], 0, 0, False),  # noqa: E501
        Target("cancel storms: engine requests that outlived their cancelled caller (orphans)", "0", RUN, f["storm_orphans"], 0, 0, False),  # noqa: E501
        Target("cancel storms: cancels the clients made that the scheduler did not count", "0", RUN, abs(f["storm_clients_cancelled"] - f["storm_scheduler_cancelled"]), 0, 0, False),  # noqa: E501
        Target("cancel storms: engine aborts the scheduler did not make (journal - scheduler)", "0", RUN, max(0, f["storm_engine_aborted"] - f["storm_scheduler_aborts"]), 0, 0, False),  # noqa: E501
        Target("peak minus idle RSS (MB)", f"<= bytes cap x 3.4 + max_queued x 24 KB (docs/operations.md) = {bound:.1f}", RUN, f["rss_growth_mb"], bound, bound, False),  # noqa: E501
        Target("duplicate live ids answered ALREADY_EXISTS", "100%", RUN, _fraction(f["duplicates_already_exists"], f["duplicates_sent"]), 1.0, 1.0, True, "%"),  # noqa: E501
        Target("oversized prompts answered PROMPT_TOO_LARGE", "100%", RUN, _fraction(f["oversized_refused"], f["oversized_sent"]), 1.0, 1.0, True, "%"),  # noqa: E501
    ]  # fmt: skip
    result.notes += [
        f"Flood sent at {f['flood_rate']:.0f} requests/s against a capacity of {f['capacity']:.1f}/s; "
        f"{f['calls']} calls in all, load for {f['load_seconds']:.0f} s, every call ended by "
        f"{f['drained_seconds']:.0f} s; refused at admission: "
        + ", ".join(f"{k} {v}" for k, v in sorted(f["refused_at_admission"].items())),
        f"Cancels: {f['queued_cancels']} while queued ({f['queued_cancels_reached_engine']} of them had already "
        f"reached the engine), {f['running_cancels']} after the first token ({f['running_cancels_engine_killed']} "
        "ended by the engine's SIGKILL first).",
        f"Cancel storms: {f['storm_rounds']} rounds of {p.storm_streams} streams of {p.storm_tokens} tokens; "
        f"cancelled by the clients {f['storm_clients_cancelled']} (other ends: {f['storm_clients_other'] or 'none'}), "
        f"by the scheduler {f['storm_scheduler_cancelled']} with {f['storm_scheduler_aborts']} engine requests "
        f"closed ({f['storm_scheduler_aborts_answered']} after the engine answered); at the engine: "
        + ", ".join(f"{k} {v}" for k, v in sorted(f["storm_engine"].items()))
        + f"; orphans {f['storm_orphans']}.",
        "Duplicate ids, second call: " + ", ".join(f"{k} {v}" for k, v in sorted(f["duplicates"].items())),
        "Oversized prompts: " + ", ".join(f"{k} {v}" for k, v in sorted(f["oversized"].items())),
        f"Scheduler RSS: idle {f['idle_rss_mb']:.1f} MB, peak {f['peak_rss_mb']:.1f} MB (sampled every 100 ms).",
        "Engine journal: " + f"{f['journal_lines']} lines over {f['journal_boots']} boots. "
        "Engine and clients are joined by the prompt's first line (`s7:<n>`), which the journal keeps as `tag`.",
        *f["log"],
    ]
    if not f["scheduler_alive"]:
        result.notes.append("**The scheduler process died during the run.**")
    result.raw = jsonable(f)
    return result


def _fraction(a: int, b: int) -> float | None:
    return a / b if b else None

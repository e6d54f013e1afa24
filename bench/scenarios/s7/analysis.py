"""S7's counts, three ways: what the clients saw, what the scheduler counted (its metrics, scraped before and
after) and what the engine's journal shows, joined by each call's tag; for the flood and for the storms."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.scenarios.s7.calls import Call
from bench.scenarios.s7.params import OUTCOMES

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # a scrape: (name, sorted labels) -> value


@dataclass
class Attempt:
    """One request at the engine (one `received` line), from the journal."""

    tag: str
    boot: int
    events: list[str] = field(default_factory=list)
    end: str = ""  # finished, aborted, failed, killed; "" when it never ended
    reason: str = ""


Attempts = dict[str, list[Attempt]]  # each tag's attempts at the engine, in order


async def scrape(session: aiohttp.ClientSession, url: str) -> Samples:
    async with session.get(url) as response:
        text = await response.text()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _sum(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in samples.items() if n == name and all((k, x) in lab for k, x in labels.items()))


def delta(before: Samples, after: Samples, name: str, **labels: str) -> int:
    """How much a counter (summed over the series `labels` select) grew between two scrapes."""
    return round(_sum(after, name, **labels) - _sum(before, name, **labels))


def engine_attempts(lines: list[dict[str, Any]]) -> tuple[Attempts, int]:
    """Per tag, its attempts at the engine in order; and how many boots the journal shows."""
    by_tag: Attempts = {}
    open_: dict[tuple[int, int], Attempt] = {}  # (boot, seq) -> attempt
    boot = 0
    for line in lines:
        event = line["event"]
        if event == "boot":
            for attempt in open_.values():
                attempt.end = "killed"
            open_.clear()
            boot += 1
            continue
        if event == "refused":
            if line.get("tag"):
                attempt = Attempt(line["tag"], boot, ["refused"], "refused", line.get("message", ""))
                by_tag.setdefault(attempt.tag, []).append(attempt)
            continue
        key = (boot, int(line["seq"]))
        if event == "received":
            attempt = Attempt(line["tag"], boot, ["received"])
            open_[key] = attempt
            by_tag.setdefault(attempt.tag, []).append(attempt)
            continue
        attempt = open_.get(key)  # type: ignore[assignment]
        if attempt is None:
            continue
        attempt.events.append(event)
        if event in ("finished", "aborted", "failed"):
            attempt.end, attempt.reason = event, line.get("reason", "")
            del open_[key]
    return by_tag, boot


def analyse(calls: list[Call], by_tag: Attempts, before: Samples, after: Samples) -> dict[str, Any]:
    """The three-way counts and every check's figure."""
    admitted = [c for c in calls if c.admitted]

    client = Counter(c.outcome for c in admitted if c.outcome)
    scheduler = {o: delta(before, after, "llmsched_request_outcomes_total", outcome=o) for o in OUTCOMES}
    engine_completed = {t for t, attempts in by_tag.items() if any(a.end == "finished" for a in attempts)}
    client_completed = {c.tag for c in admitted if c.outcome == "completed"}
    admitted_tags = {c.tag for c in admitted}
    engine_state: Counter[str] = Counter()
    for c in admitted:
        attempts = by_tag.get(c.tag, [])
        if not attempts:
            engine_state["never reached the engine"] += 1
        elif c.tag in engine_completed:
            engine_state["finished at the engine"] += 1
        else:
            engine_state[f"last attempt {attempts[-1].end or 'never ended'}"] += 1
    unterminated = sum(1 for attempts in by_tag.values() for a in attempts if not a.end)
    phantom = sorted(t for t in by_tag if t.startswith("s7:") and t not in admitted_tags)
    phantom_reached = [t for t in phantom if any(a.end != "refused" for a in by_tag[t])]
    outcome_mismatch = sum(abs(client.get(o, 0) - scheduler[o]) for o in OUTCOMES)
    completed_mismatch = len(client_completed ^ engine_completed & admitted_tags)
    hung = [c for c in admitted if c.outcome is None]
    sched_admitted = delta(before, after, "llmsched_requests_admitted_total")
    lost = len(hung) + max(0, sched_admitted - sum(scheduler.values()))

    twice_engine = [t for t, attempts in by_tag.items() if sum(a.end == "finished" for a in attempts) > 1]
    twice_client = [c.tag for c in calls if c.dispatches_after_token]
    client_failovers = sum(max(0, c.dispatches - 1) for c in calls)
    sched_failovers = delta(before, after, "llmsched_requests_failed_over_total")

    running_cancelled = [c for c in calls if c.cancel_phase == "running"]
    not_aborted = []
    killed_meanwhile = 0
    for c in running_cancelled:
        last = (by_tag.get(c.tag) or [Attempt(c.tag, 0)])[-1]
        if last.end == "aborted":
            continue
        if last.end == "killed":
            killed_meanwhile += 1
            continue
        not_aborted.append((c.tag, last.end or "no end line"))
    queued_cancelled = [c for c in calls if c.cancel_phase == "queued"]
    queued_reached = [c.tag for c in queued_cancelled if by_tag.get(c.tag)]
    queued_reached_not_aborted = [
        t for t in queued_reached if by_tag[t][-1].end not in ("aborted", "killed", "refused")
    ]

    dup_second = [c for c in calls if c.kind == "dup-second"]
    oversized = [c for c in calls if c.kind == "oversized"]
    refused_by_caps = Counter(f"{c.code} {c.reason}".strip() for c in calls if not c.admitted and c.end == "error")
    return {
        "calls": len(calls),
        "admitted": {"clients": len(admitted), "scheduler": sched_admitted},
        "outcomes": {"clients": dict(client), "scheduler": scheduler},
        "engine_states": dict(engine_state),
        "engine_completed": len(engine_completed & admitted_tags),
        "client_completed": len(client_completed),
        "outcome_mismatch": outcome_mismatch,
        "completed_mismatch": completed_mismatch,
        "unterminated_at_engine": unterminated,
        "engine_tags_not_admitted": len(phantom),
        "engine_served_not_admitted": phantom_reached[:20],
        "hung": [f"{c.tag} {c.kind} dispatches={c.dispatches} tokens={c.tokens}" for c in hung][:20],
        "lost": lost,
        "served_twice_engine": twice_engine[:20],
        "served_twice_client": twice_client[:20],
        "served_twice": len(twice_engine) + len(twice_client),
        "failovers": {"clients": client_failovers, "scheduler": sched_failovers},
        "running_cancels": len(running_cancelled),
        "running_cancels_not_aborted": not_aborted[:20],
        "running_cancels_not_aborted_count": len(not_aborted),
        "running_cancels_engine_killed": killed_meanwhile,
        "queued_cancels": len(queued_cancelled),
        "queued_cancels_reached_engine": len(queued_reached),
        "queued_cancels_reached_not_aborted": queued_reached_not_aborted[:20],
        "duplicates": dict(Counter(f"{c.code or c.end}" for c in dup_second)),
        "duplicates_sent": len(dup_second),
        "duplicates_already_exists": sum(c.code == "ALREADY_EXISTS" for c in dup_second),
        "oversized": dict(Counter(f"{c.code or c.end} {c.reason}".strip() for c in oversized)),
        "oversized_sent": len(oversized),
        "oversized_refused": sum(c.code == "INVALID_ARGUMENT" and c.reason == "PROMPT_TOO_LARGE" for c in oversized),
        "refused_at_admission": dict(refused_by_caps),
        "flood_calls": sum(c.kind == "flood" for c in calls),
    }


def analyse_storms(calls: list[Call], by_tag: Attempts, before: Samples, after: Samples) -> dict[str, Any]:
    """The storms' cancels three ways: clients, scheduler (outcomes and engine aborts), engine journal."""

    cancelled = [c for c in calls if c.end == "cancelled"]
    journal: Counter[str] = Counter()
    orphans = []
    for c in cancelled:
        attempts = by_tag.get(c.tag, [])
        if not attempts:
            journal["never reached the engine"] += 1
            continue
        last = attempts[-1]
        journal[last.end or "never ended"] += 1
        if last.end not in ("aborted", "refused"):
            orphans.append(f"{c.tag} {last.end or 'never ended'} {last.events}")
    aborted = journal["aborted"]
    scheduler_aborts = delta(before, after, "llmsched_engine_aborts_total")
    return {
        "storm_calls": len(calls),
        "storm_rounds": len({c.user.rsplit("-", 1)[0] for c in calls}),
        "storm_admitted": sum(c.admitted for c in calls),
        "storm_clients_cancelled": len(cancelled),
        "storm_clients_other": dict(Counter(f"{c.end} {c.code}".strip() for c in calls if c.end != "cancelled")),
        "storm_scheduler_cancelled": delta(before, after, "llmsched_request_outcomes_total", outcome="cancelled"),
        "storm_scheduler_aborts": scheduler_aborts,
        "storm_scheduler_aborts_answered": delta(before, after, "llmsched_engine_aborts_total", stage="answered"),
        "storm_engine": dict(journal),
        "storm_engine_aborted": aborted,
        "storm_orphans": len(orphans),
        "storm_orphan_list": orphans[:20],
    }

"""R1's gate report: where the slots went empty while the scheduler held work (gate samples by reason, and
a one-second timeline), and the layout's Markdown file with it."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from typing import Any

from bench.report import scenario_markdown
from bench.results import ScenarioResult
from bench.scenarios.common import median
from bench.scenarios.r1.figures import nearest_rank
from bench.scenarios.r1.setups import SLOTS

_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def gate_summary(run: dict[str, Any]) -> dict[str, Any]:
    """Where the slots went empty: gate samples with the engine's last reading below a full batch while the
    scheduler held queued work, by reason, and a one-second timeline."""
    gates: list[dict[str, Any]] = run["gates"]
    if not gates:
        return {}
    reasons = Counter(_NUMBER.sub("N", g["reason"]) for g in gates)
    empty = [g for g in gates if g["queued"] > 0 and g["engine_running"] < SLOTS]
    empty_reasons = Counter(("open" if g["open"] else "closed: ") + _NUMBER.sub("N", g["reason"]) for g in empty)
    timeline = []
    for second in range(int(max(g["t"] for g in gates)) + 1):
        bucket = [g for g in gates if second <= g["t"] < second + 1]
        if not bucket:
            continue
        timeline.append(
            {
                "t": second,
                "queued": max(g["queued"] for g in bucket),
                "engine_running": statistics.fmean(g["engine_running"] for g in bucket),
                "engine_waiting": statistics.fmean(g["engine_waiting"] for g in bucket),
                "in_flight": statistics.fmean(g["in_flight"] for g in bucket),
                "sent_unseen": statistics.fmean(g["sent_unseen"] for g in bucket),
                "estimated_waiting": statistics.fmean(g["estimated_waiting"] for g in bucket),
                "age": max(g["age"] for g in bucket),
                "open": sum(g["open"] for g in bucket) / len(bucket),
                "reason": Counter(_NUMBER.sub("N", g["reason"]) for g in bucket).most_common(1)[0][0],
            }
        )
    ages = [g["age"] for g in gates if g["age"] >= 0]
    return {
        "samples": len(gates),
        "reasons": dict(reasons.most_common()),
        "empty_with_queue": len(empty),
        "empty_reasons": dict(empty_reasons.most_common()),
        "reading_age_median": median(ages),
        "reading_age_p90": nearest_rank(ages, 0.9),
        "timeline": timeline,
    }


def layout_markdown(result: ScenarioResult, meta: dict[str, Any]) -> str:
    lines = [scenario_markdown(result), ""]
    lines.append(f"Host: {meta.get('host')}; engine processes: ")
    lines += [f"- {row}" for row in meta.get("processes", [])]
    lines.append(f"- engine CPU seconds by role over the layout's runs: {meta.get('engine_cpu')}")
    for key, runs in result.raw.get("gates", {}).items():
        for i, summary in enumerate(runs):
            if not summary:
                continue
            lines.append(
                f"\nGate samples, {key}, round {i + 1}: {summary['samples']} samples, reading age median "
                f"{summary['reading_age_median']}, p90 {summary['reading_age_p90']}; samples with the engine "
                f"below {SLOTS} running while the scheduler held work: {summary['empty_with_queue']}"
            )
            lines.append(f"- reasons: {summary['reasons']}")
            lines.append(f"- reasons when slots were empty with work queued: {summary['empty_reasons']}")
            lines.append(
                "\n| t (s) | sched queued | engine running | engine waiting | in flight | sent unseen | "
                "est. waiting | max age | gate open | main reason |\n|---|---|---|---|---|---|---|---|---|---|"
            )
            for row in summary["timeline"]:
                lines.append(
                    f"| {row['t']} | {row['queued']} | {row['engine_running']:.1f} | {row['engine_waiting']:.1f} | "
                    f"{row['in_flight']:.1f} | {row['sent_unseen']:.1f} | {row['estimated_waiting']:.1f} | "
                    f"{row['age']:.2f} | {row['open']:.0%} | {row['reason']} |"
                )
    return "\n".join(lines) + "\n"

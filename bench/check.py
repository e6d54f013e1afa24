"""The regression check: every target's value against its tolerance, as a table and an exit status.

A target "missed" by a little is reported but passes; only a value past the target's `fail_at` (the
stated tolerance) fails the check, and so does a target that could not be measured in a run that ran.
A scenario the service cannot run yet ("not available") is listed and does not fail it.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.report import format_value
from bench.results import ScenarioResult


def evaluate(results: Sequence[ScenarioResult]) -> tuple[str, bool]:
    """(a printable report, whether any target regressed)."""
    lines = []
    failed = False
    for result in results:
        if not result.available:
            lines.append(f"SKIP  {result.id} {result.title}: not available ({result.reason})")
            continue
        for target in result.targets:
            regressed = target.regressed
            failed |= regressed
            verdict = "FAIL" if regressed else "ok  "
            lines.append(
                f"{verdict}  {result.id} {target.figure} [{target.run}]: {format_value(target)} "
                f"(target {target.target}: {target.status}; {target.tolerance_text})"
            )
    lines.append("regression check: " + ("FAILED" if failed else "passed"))
    return "\n".join(lines), failed

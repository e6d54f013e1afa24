"""What a scenario hands to the report, the plots and the regression check, and how it is stored as JSON.

Each target carries its scenario's threshold (bench/scenarios/, docs/benchmarks.md) and a separate `fail_at`
for the regression check: "met" compares with the threshold, `--check` only fails past `fail_at`, so the
stated tolerance absorbs the noise of a shared 2-core machine without hiding a real regression.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Target:
    """One target of a scenario, measured in one run."""

    figure: str
    target: str
    run: str
    value: float | None
    threshold: float
    fail_at: float
    higher_is_better: bool = True
    unit: str = ""

    @classmethod
    def at_most(
        cls, figure: str, target: str, run: str, value: float | None, threshold: float, fail_at: float, unit: str = ""
    ) -> Target:
        """A figure that must stay at or under `threshold`; the check fails past `fail_at`."""
        return cls(figure, target, run, value, threshold, fail_at, False, unit)

    @classmethod
    def at_least(
        cls, figure: str, target: str, run: str, value: float | None, threshold: float, fail_at: float, unit: str = ""
    ) -> Target:
        """A figure that must reach `threshold`; the check fails under `fail_at`."""
        return cls(figure, target, run, value, threshold, fail_at, True, unit)

    @property
    def status(self) -> str:
        """ "met", "missed", or "n/a" when nothing was measured."""
        if self.value is None:
            return "n/a"
        ok = self.value >= self.threshold if self.higher_is_better else self.value <= self.threshold
        return "met" if ok else "missed"

    @property
    def regressed(self) -> bool:
        """True when the value is past the check's tolerance (a missing value counts as a regression)."""
        if self.value is None:
            return True
        return self.value < self.fail_at if self.higher_is_better else self.value > self.fail_at

    def format(self, value: float | None) -> str:
        """A value in this target's unit: " s" (ms below a second), "x" (two decimals below 2x), "%" (a fraction),
        or plain."""
        if value is None:
            return "-"
        if self.unit == " s":
            return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.2f} s"
        if self.unit == "x":  # two decimals near 1, where targets such as 1.1x are set
            return f"{value:.2f}x" if abs(value) < 2 else f"{value:.1f}x"
        if self.unit == "%":
            return f"{value:.1%}"
        return f"{value:.3g}"

    @property
    def tolerance_text(self) -> str:
        op = "<" if self.higher_is_better else ">"
        return f"fails if {op} {self.format(self.fail_at)}"


@dataclass
class Table:
    """A Markdown table: rows of already formatted cells."""

    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)


@dataclass
class ScenarioResult:
    """Everything one scenario produced."""

    id: str
    title: str
    workload: str
    engine: str = ""
    available: bool = True
    reason: str = ""
    table: Table | None = None
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    series: dict[str, Any] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @classmethod
    def unavailable(cls, id: str, title: str, workload: str, reason: str) -> ScenarioResult:
        return cls(id, title, workload, available=False, reason=reason)


def save(results: list[ScenarioResult], meta: dict[str, Any], path: Path) -> None:
    payload = {"meta": meta, "scenarios": [dataclasses.asdict(r) for r in results]}
    path.write_text(json.dumps(payload, indent=1, default=_jsonable))


def load(path: Path) -> tuple[list[ScenarioResult], dict[str, Any]]:
    payload = json.loads(path.read_text())
    results = []
    for raw in payload["scenarios"]:
        table = Table(**raw.pop("table")) if raw.get("table") else None
        targets = [Target(**t) for t in raw.pop("targets")]
        raw.pop("table", None)
        results.append(ScenarioResult(**raw, table=table, targets=targets))
    return results, payload["meta"]


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")

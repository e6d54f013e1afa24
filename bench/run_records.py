"""One JSON record per bench run, kept in the repository: what ran, on which machine, and every figure with
its target.

`python -m bench` writes a record into `bench/results/records/` (tracked) at the end of every run: the
commit, the date, the machine (cores, CPU model, load average before and after), the setup (engine, command,
options) and, for each scenario, its table and targets. The tables in `docs/benchmarks.md` and the README's
headline table are rendered from the latest record of each scenario (`scripts/gen_docs.py`), so results are
data that a reader can trace to a run, not prose that goes stale. Per-request figures stay in the run's
`results.json` beside it (git-ignored: they are large and only needed to dig into one run).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.results import ScenarioResult, Table, Target

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "bench" / "results" / "records"
FORMAT = 1  # bumped when a record's shape changes, so old records are still read correctly


@dataclass(frozen=True)
class ScenarioRecord:
    """One scenario's part of a record: its table and its figures against their targets."""

    id: str
    title: str
    workload: str
    engine: str
    available: bool
    reason: str
    seconds: float
    table: Table | None
    targets: list[Target]
    notes: list[str]


@dataclass(frozen=True)
class RunRecord:
    """A whole run: where and how it ran, and its scenarios."""

    path: Path
    commit: str
    date: str  # ISO 8601, UTC
    command: str
    machine: dict[str, Any]
    setup: dict[str, Any]
    scenarios: list[ScenarioRecord]

    @property
    def name(self) -> str:
        """The record's path from the repository root, as the docs cite it."""
        try:
            return self.path.relative_to(ROOT).as_posix()
        except ValueError:
            return self.path.as_posix()

    def machine_text(self) -> str:
        """ "2 cores (CPU model), load average 0.4 before, 1.9 after"."""
        m = self.machine
        before, after = m.get("load_average_before", [None])[0], m.get("load_average_after", [None])[0]
        load = "" if before is None or after is None else f", load average {before:.1f} before, {after:.1f} after"
        return f"{m.get('cores', '?')} cores ({m.get('cpu_model', 'unknown CPU')}){load}"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine(load_before: Sequence[float], load_after: Sequence[float]) -> dict[str, Any]:
    """What the figures depend on besides the code: cores, CPU model and how busy the machine was."""
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "python": platform.python_version(),
    }


def commit() -> str:
    """The checked-out commit (short hash), with "+changes" when the tree has uncommitted changes."""

    def git(*args: str) -> str:
        run = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return run.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results", ":!bench/figures")
    return f"{head}+changes" if dirty else head


def to_json(
    results: Iterable[ScenarioResult],
    *,
    command: str,
    machine_info: dict[str, Any],
    setup: dict[str, Any],
    when: datetime.datetime,
    commit_id: str,
) -> dict[str, Any]:
    """The record of one run, as written to disk (no per-request data: that stays in results.json)."""
    return {
        "format": FORMAT,
        "commit": commit_id,
        "date": when.astimezone(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine_info,
        "setup": setup,
        "scenarios": [_scenario_json(r) for r in results],
    }


def _scenario_json(result: ScenarioResult) -> dict[str, Any]:
    return {
        "id": result.id,
        "title": result.title,
        "workload": result.workload,
        "engine": result.engine,
        "available": result.available,
        "reason": result.reason,
        "seconds": round(result.seconds, 1),
        "table": None if result.table is None else {"columns": result.table.columns, "rows": result.table.rows},
        "targets": [
            {
                "figure": t.figure,
                "target": t.target,
                "run": t.run,
                "value": t.value,
                "threshold": t.threshold,
                "fail_at": t.fail_at,
                "higher_is_better": t.higher_is_better,
                "unit": t.unit,
                "status": t.status,
            }
            for t in result.targets
        ],
        "notes": list(result.notes),
    }


def file_name(record: dict[str, Any]) -> str:
    """`20261205T010203Z-abc1234-sim-S1-S2.json`: sorts by time, and says what ran (ids made safe for a file name:
    "R1 vllm, gpu_host, flood" becomes R1-vllm-gpu_host-flood)."""
    when = datetime.datetime.fromisoformat(record["date"]).strftime("%Y%m%dT%H%M%SZ")
    ids = "-".join(re.sub(r"[^A-Za-z0-9_]+", "-", s["id"]).strip("-") for s in record["scenarios"]) or "none"
    if len(ids) > 60:
        ids = f"{len(record['scenarios'])}-scenarios"
    engine = record["setup"].get("engine", "sim")
    return f"{when}-{record['commit'].replace('+', '-')}-{engine}-{ids}.json"


def write(record: dict[str, Any], folder: Path = RECORDS) -> Path:
    """Write a record (pretty, stable key order) and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(record)
    path.write_text(json.dumps(record, indent=1, sort_keys=True, default=_jsonable) + "\n")
    return path


def _jsonable(value: Any) -> Any:
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def read(path: Path) -> RunRecord:
    raw = json.loads(path.read_text())
    scenarios = []
    for s in raw["scenarios"]:
        table = Table(s["table"]["columns"], s["table"]["rows"]) if s.get("table") else None
        targets = [Target(**{k: v for k, v in t.items() if k != "status"}) for t in s["targets"]]
        fields = {k: s[k] for k in ("id", "title", "workload", "engine", "available", "reason", "seconds", "notes")}
        scenarios.append(ScenarioRecord(**fields, table=table, targets=targets))
    return RunRecord(path, raw["commit"], raw["date"], raw["command"], raw["machine"], raw["setup"], scenarios)


def read_all(folder: Path = RECORDS) -> list[RunRecord]:
    """Every record in the folder, oldest first."""
    if not folder.is_dir():
        return []
    records = [read(p) for p in folder.glob("*.json")]
    return sorted(records, key=lambda r: (r.date, r.path.name))


def latest(records: Sequence[RunRecord]) -> dict[str, tuple[RunRecord, ScenarioRecord]]:
    """Scenario id -> the newest record that measured it (a run where it could not run does not count)."""
    found: dict[str, tuple[RunRecord, ScenarioRecord]] = {}
    for record in records:  # oldest first: a newer record replaces an older one
        for scenario in record.scenarios:
            if scenario.available and scenario.targets:
                found[scenario.id] = (record, scenario)
    return found

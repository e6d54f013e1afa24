"""A bench run's record: written with what the docs need (commit, date, machine, setup, every figure with its
target), read back the same, and the latest record of each scenario is the one the docs render."""

from __future__ import annotations

import datetime
from pathlib import Path

from bench import run_records
from bench.results import ScenarioResult, Table, Target


def _result(id: str, value: float, available: bool = True) -> ScenarioResult:
    if not available:
        return ScenarioResult.unavailable(id, "t", "w", "no engine")
    target = Target("worst TTFT", "<= 1 s", "scheduler", value, 1.0, 1.25, False, " s")
    return ScenarioResult(id, "t", "w", "sim", table=Table(["a"], [["1"]]), targets=[target], notes=["n"])


def _write(folder: Path, when: str, results: list[ScenarioResult], commit: str = "abc1234") -> Path:
    record = run_records.to_json(
        results,
        command="python -m bench --scenarios S1",
        machine_info=run_records.machine((1.0, 0.5, 0.2), (2.0, 1.0, 0.4)),
        setup={"engine": "sim"},
        when=datetime.datetime.fromisoformat(when),
        commit_id=commit,
    )
    return run_records.write(record, folder)


def test_a_record_keeps_the_machine_the_setup_and_every_figure(tmp_path: Path) -> None:
    path = _write(tmp_path, "2030-01-02T03:04:05+00:00", [_result("S1", 0.5), _result("R1 vllm, gpu_host, flood", 2.0)])
    assert path.name == "20300102T030405Z-abc1234-sim-S1-R1-vllm-gpu_host-flood.json"
    (record,) = run_records.read_all(tmp_path)
    assert record.commit == "abc1234" and record.command == "python -m bench --scenarios S1"
    assert record.machine["cores"] and record.machine["cpu_model"]
    assert record.machine["load_average_before"] == [1.0, 0.5, 0.2] and record.machine["load_average_after"][0] == 2.0
    assert "load average 1.0 before, 2.0 after" in record.machine_text()
    s1, r1 = record.scenarios
    assert s1.targets[0].value == 0.5 and s1.targets[0].status == "met" and r1.targets[0].status == "missed"
    assert s1.table is not None and s1.table.rows == [["1"]] and s1.notes == ["n"]


def test_the_latest_record_of_each_scenario_wins_and_unavailable_runs_do_not_count(tmp_path: Path) -> None:
    _write(tmp_path, "2030-01-01T00:00:00+00:00", [_result("S1", 0.5), _result("S3", 0.1)], commit="old")
    _write(tmp_path, "2030-01-02T00:00:00+00:00", [_result("S1", 0.7), _result("S3", 0, available=False)], commit="new")
    latest = run_records.latest(run_records.read_all(tmp_path))
    assert latest["S1"][0].commit == "new" and latest["S1"][1].targets[0].value == 0.7
    assert latest["S3"][0].commit == "old"  # the newer run could not measure it


def test_the_repository_records_read() -> None:
    """Every committed record still reads with today's reader (a changed shape needs FORMAT and a reader)."""
    records = run_records.read_all()
    assert records, "bench/results/records/ holds no record"
    assert all(r.scenarios and r.commit and r.date for r in records)

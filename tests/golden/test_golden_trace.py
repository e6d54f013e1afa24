"""Golden dispatch traces: every decision the dispatcher makes on a fixed, seeded workload, compared exactly.

Each scenario (`scenarios.py`: every fairness policy x ordering x band setup x prefix locality off / on /
with D-LPM x users alone or in weighted groups) runs the same workload (`workload.py`: floods, a steady
mix of classes, latecomers, deadlines, clients that leave, requests engines refuse) against three fake
engines (a priority vLLM, a llama.cpp, a flaky shared FIFO vLLM with outages of requests and of metrics)
through the real core, on a virtual clock (`simulation.py`). The trace is the sequence of what the core
decided: each dispatch (request, user, class, backend, engine priority, attempt, virtual time in ms), each
failover requeue, each outcome, each refused admission. `traces/<scenario>.jsonl` holds it; the test
compares it line for line.

The core is reached only through `driver.py`. When the core's classes move, re-plumb that module alone:
the traces must stay byte for byte the same, which is the proof that the behaviour did not change.

Re-recording: `.venv/bin/python -m tests.golden.record` (all scenarios; `--check` compares without
writing; names select scenarios). A trace changes only with the dispatcher's behaviour: a deliberate
behaviour change re-records it, in its own commit, with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.golden.driver import policy_names, unstated_fields
from tests.golden.record import TRACES, trace_path, trace_text
from tests.golden.scenarios import ENGINES, FAIRNESS, SCENARIOS, Scenario
from tests.golden.simulation import run_scenario
from tests.golden.workload import USERS

ROOT = Path(__file__).resolve().parents[2]


def _ids(scenario: Scenario) -> str:
    return scenario.name


def _recorded(scenario: Scenario) -> list[dict[str, Any]]:
    lines = trace_path(scenario).read_text().splitlines()
    return [json.loads(line) for line in lines[1:]]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=_ids)
def test_the_dispatcher_makes_the_recorded_decisions(scenario: Scenario) -> None:
    path = trace_path(scenario)
    assert path.exists(), f"no trace for {scenario.name}: python -m tests.golden.record {scenario.name}"
    recorded = path.read_text()
    now = trace_text(scenario)
    if now != recorded:
        actual, expected = now.splitlines(), recorded.splitlines()
        at = next((i for i, (a, e) in enumerate(zip(actual, expected, strict=False)) if a != e), None)
        at = min(len(actual), len(expected)) if at is None else at
        context = "\n".join(f"  {line}" for line in expected[max(0, at - 3) : at])
        pytest.fail(
            f"{path.name} line {at + 1} differs ({len(actual)} lines now, {len(expected)} recorded)\n"
            f"before it:\n{context}\nrecorded: {expected[at] if at < len(expected) else '(end)'}\n"
            f"now:      {actual[at] if at < len(actual) else '(end)'}"
        )


def test_every_trace_file_belongs_to_a_scenario() -> None:
    assert {p.name for p in TRACES.glob("*.jsonl")} == {trace_path(s).name for s in SCENARIOS}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=_ids)
def test_each_scenario_states_every_configuration_field(scenario: Scenario) -> None:
    """A field left to its default would let a change of that default move the trace."""
    assert unstated_fields(scenario.config()) == []


def test_a_configuration_missing_a_field_is_caught() -> None:
    config = SCENARIOS[0].config()
    del config["models"][0]["locality"]["deficit_bound"]
    del config["scheduling"]["classes"][2]["rank"]
    del config["cluster"]
    assert unstated_fields(config) == ["scheduling.classes[2].rank", "models[0].locality.deficit_bound", "cluster"]


def test_the_scenarios_cover_every_registered_policy() -> None:
    """Test-only policies (named `test_...`) aside, a new policy needs its scenarios and traces."""
    registered = {kind: {n for n in names if not n.startswith("test_")} for kind, names in policy_names().items()}
    configs = [s.config() for s in SCENARIOS]
    covered = {
        "fairness": {c["scheduling"]["fairness"] for c in configs},
        "ordering": {c["scheduling"]["ordering"] for c in configs},
        "band": {c["scheduling"]["band_policy"] for c in configs},
        "backend": {c["models"][0]["backend_policy"] for c in configs},
    }
    assert covered == registered
    assert {s.groups for s in SCENARIOS if s.fairness != "round_robin"} == {False, True}
    assert {c["models"][0]["locality"]["deficit_bound"] > 0 for c in configs} == {False, True}
    assert {c["scheduling"]["classes"][2]["starvation_after_seconds"] > 0 for c in configs} == {False, True}


def _ended_queued_and_running(events: list[dict[str, Any]], outcome: str) -> tuple[int, int]:
    """How many requests ended with `outcome` while queued, and how many while at an engine."""
    at_engine: set[str] = set()
    queued = running = 0
    for event in events:
        if event["ev"] == "dispatch":
            at_engine.add(event["req"])
        elif event["ev"] == "requeue":
            at_engine.discard(event["req"])
        elif event["ev"] == "end" and event["outcome"] == outcome:
            if event["req"] in at_engine:
                running += 1
            else:
                queued += 1
    return queued, running


@pytest.mark.parametrize("scenario", SCENARIOS, ids=_ids)
def test_every_trace_shows_what_the_workload_is_there_for(scenario: Scenario) -> None:
    """Each recorded trace holds the cases it is meant to pin: every engine and class served, engine
    priorities sent and not, failovers, refused admissions, and each kind of ending."""
    events = _recorded(scenario)
    dispatches = [e for e in events if e["ev"] == "dispatch"]
    assert {e["backend"] for e in dispatches} == set(ENGINES)
    assert {e["cls"] for e in dispatches} == {"interactive", "review", "batch"}
    assert {e["user"] for e in dispatches} == set(USERS)
    assert {e["prio"] is None for e in dispatches} == {False, True}
    assert any(e["attempt"] > 1 for e in dispatches), "no failed-over request was sent again"
    assert any(e["ev"] == "reject" and e["reason"] == "QUEUE_FULL" for e in events)
    outcomes = Counter(e["outcome"] for e in events if e["ev"] == "end")
    assert set(outcomes) == {"completed", "failed", "cancelled", "expired"}
    assert all(n >= 1 for n in _ended_queued_and_running(events, "cancelled")), "a client left queued and running"
    assert _ended_queued_and_running(events, "expired")[0] >= 1
    admitted = {e["req"] for e in events} - {e["req"] for e in events if e["ev"] == "reject"}
    assert sum(outcomes.values()) == len(admitted), "a request ended twice or never"


def test_a_scenario_runs_the_same_twice_in_one_process() -> None:
    """Nothing of one run leaks into the next (the traces are compared in whatever order tests run)."""
    scenario = next(s for s in SCENARIOS if s.fairness == "vtc" and s.locality == "dlpm" and s.groups)
    assert run_scenario(scenario) == run_scenario(scenario)


def test_the_traces_do_not_depend_on_string_hashing() -> None:
    """Python salts str hashes per process (this one's too, at random): a decision that followed a set's
    order would differ between processes. A fresh interpreter with another fixed salt, one scenario per
    fairness policy."""
    chosen = [
        s.name
        for s in SCENARIOS
        if s.ordering == "edf" and s.bands == "guarded" and s.locality == "dlpm" and s.groups == (s.fairness == "vtc")
    ]
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "tests.golden.record", "--check", *chosen],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"{len(FAIRNESS)} scenarios, 0 differ")

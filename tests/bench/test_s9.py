"""S9 at small sizes: its engine model keeps the simulator's timing, a day is the same for a seed, vtc holds
the heaviest user nearer its fair share than FIFO on the same arrivals, and the decision-cost and memory
parts run the core as configured."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.product import SimConfig, configure_logging, step_seconds
from bench.registry import BY_ID, defaults
from bench.scenarios.s9 import day, decision_cost, memory
from bench.scenarios.s9.engine import BatchEngine, Job
from bench.scenarios.s9.measures import fair_shares
from bench.scenarios.s9.parts import policy_modes
from bench.scenarios.s9.summary import build_result

TINY_DAY = day.DayParams(users=90, engines=3, seconds=90.0, load=1.4)
FACE_LIBRARIES = ("grpc", "google.protobuf", "opentelemetry", "redis")  # the vLLM adapters load aiohttp
ROOT = Path(__file__).resolve().parents[2]
MACHINE = ("wall_seconds", "cpu_seconds", "cpu_us_per_request", "decision_cpu_us_per_request")


@pytest.fixture(autouse=True)
def _quiet() -> None:
    configure_logging("error")


def test_s9_is_registered_for_the_simulator() -> None:
    assert BY_ID["S9"].produces == ("S9",)
    assert "S9" in defaults("sim") and "S9" not in defaults("vllm")


class Heard:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, float]] = []
        self.now = 0.0

    def first_token(self, engine: BatchEngine, job: Job) -> None:
        self.events.append(("first", job.request_id, self.now))

    def tokens(self, engine: BatchEngine, job: Job, count: int) -> None:
        pass

    def finished(self, engine: BatchEngine, job: Job) -> None:
        self.events.append(("end", job.request_id, self.now))

    def steps(self, engine: BatchEngine, count: int, batch: int) -> None:
        pass


def test_the_engine_model_steps_as_the_simulator_times_a_step() -> None:
    config = SimConfig(max_num_seqs=2, decode_base_ms=10.0, decode_per_seq_ms=2.0, prefill_per_token_ms=0.0)
    heard = Heard()
    queue: list[tuple[float, int, Callable[[], None]]] = []

    def at(when: float, action: Callable[[], None]) -> None:
        queue.append((when, len(queue), action))

    engine = BatchEngine("e", config, at, heard, report_every=1000)
    engine.add(Job("a", "p" * 40, 10, 3, 0, 0), 0.0)  # a and b arrive together: both in the first step
    engine.add(Job("b", "q" * 40, 10, 5, 0, 0), 0.0)
    engine.add(Job("c", "r" * 40, 10, 1, 0, 0), 0.0)  # no slot: taken in when "a" ends
    while queue:
        queue.sort(key=lambda item: (item[0], item[1]))
        heard.now, _, action = queue.pop(0)
        action()
    one, two = sum(step_seconds(config, 1, 0)), sum(step_seconds(config, 2, 0))  # a step of one, of two requests
    ends = {rid: when for kind, rid, when in heard.events if kind == "end"}
    assert ends["a"] == pytest.approx(3 * two)
    assert ends["c"] == pytest.approx(4 * two)  # taken in at a's end, done in one step
    assert ends["b"] == pytest.approx(4 * two + one)  # its last token alone
    assert engine.steps_run == 5


def test_water_filling_gives_what_is_asked_below_the_level_and_the_level_above() -> None:
    shares = fair_shares({"a": 10.0, "b": 100.0, "c": 100.0}, 90.0)
    assert shares == pytest.approx({"a": 10.0, "b": 40.0, "c": 40.0})


def test_a_day_is_the_same_for_a_seed_and_vtc_holds_the_heaviest_user_nearer_its_share_than_fifo() -> None:
    first, again = day.run_setup(TINY_DAY, fifo=False), day.run_setup(TINY_DAY, fifo=False)
    assert {k: v for k, v in first.items() if k not in MACHINE} == {k: v for k, v in again.items() if k not in MACHINE}
    fifo = day.run_setup(TINY_DAY, fifo=True)
    assert first["arrived"] == fifo["arrived"] > 100  # the same arrivals
    assert first["heaviest_share_over_fair"] < fifo["heaviest_share_over_fair"]
    assert first["ttft_light_mean"] < fifo["ttft_light_mean"]
    assert first["bound_held"] and first["largest_service_difference"] > 0
    assert first["full_step_share"] is not None and first["full_step_share"] > 0.9


def test_every_fairness_policy_and_mode_dispatches_through_the_stepped_core() -> None:
    modes = policy_modes()
    assert {policy for policy, _, _ in modes} == {"round_robin", "weighted_round_robin", "vtc", "vtc_basic"}
    assert {(bound > 0, groups > 0) for _, bound, groups in modes} == {
        (False, False),
        (True, False),
        (False, True),
        (True, True),
    }
    for policy, bound, groups in modes:
        costs = decision_cost.measure(
            30, dispatches=40, backends=4, fairness=policy, deficit_bound=bound, groups=groups
        )
        assert costs.dispatches >= 40 and costs.admitted >= 30
        assert costs.dispatch_us_median > 0


def test_queued_requests_stay_queued_behind_full_engines_and_the_figures_reach_the_result() -> None:
    measured = memory.measure(memory.MemoryParams(requests=300, users=30, backends=2))
    assert measured.rss_after >= measured.rss_before > 0
    costs = decision_cost.measure(10, dispatches=20, backends=4)
    figures = {
        "decision_cost": [dataclasses.asdict(costs)],
        "policies": [],
        "day": {},
        "memory": dataclasses.asdict(measured),
    }
    from bench.scenarios.s9.parts import QUICK

    result = build_result(figures, dataclasses.replace(QUICK, policy_users=(10, 30)), targets=False)
    assert result.table is not None and result.table.rows[0][0] == "10"
    assert any(note.startswith("memory: 300 requests") for note in result.notes)


def test_the_memory_part_holds_the_core_alone_none_of_the_faces_libraries() -> None:
    """Its fresh process counts what the core holds: a library the core never loads (gRPC, protobuf,
    OpenTelemetry, the Redis client) imported on the way would count its tens of megabytes as the core's."""
    script = (
        "import sys\n"
        "from bench.scenarios.s9 import memory\n"
        "memory.measure(memory.MemoryParams(requests=20, users=4, backends=2))\n"
        f"print(sorted(m for m in {FACE_LIBRARIES!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout

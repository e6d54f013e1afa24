"""S9 (a): what one admission and one dispatch cost the core, with 10 to 100,000 users backlogged.

One model on 100 backends (simulated vLLM engines serving first come first served, 8 slots each, prefix
caching), `prefix_locality`, three classes; N users, one in three per class, each with enough requests queued to
stay backlogged while the engines take `dispatches` of them. Admission is measured first, with every gate
shown a full engine (nothing goes): the CPU of building and queueing each call and of the pass it wakes.
Then the engines start: every pass that sends requests is timed (`process_time_ns` around the core's
pass), and the cost of a dispatch is that pass's CPU over the requests it sent; the median over passes is
the figure, the mean over every pass (those that sent nothing included) beside it.

`use_baseline` runs the same with the walks the index and the kept gate answers replaced (`baseline`); `groups`
puts the users in shared groups (two-level fairness); `deficit_bound` turns on D-LPM's locality window.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

from bench.product import SimConfig
from bench.scenarios.s9 import baseline
from bench.scenarios.s9.core_config import CLASSES, MODEL, PRIORITY_ENGINES, config
from bench.scenarios.s9.simulation import Call, Observer, Simulation

USERS = (10, 100, 1_000, 10_000, 100_000)


@dataclass
class Costs:
    users: int
    baseline: bool
    admitted: int
    admission_us: float  # CPU per admission (the call built and queued, and the pass it wakes)
    dispatches: int
    dispatch_us_median: float  # over passes that sent: the pass's CPU / what it sent
    dispatch_us_p90: float
    decision_us_per_dispatch: float  # every pass's CPU (those that sent nothing included) / dispatches
    wall_seconds: float


class PassTimes(Observer):
    """The CPU of each pass, with what it sent."""

    def __init__(self) -> None:
        self.per_dispatch: list[float] = []
        self.dispatched = 0

    def passed(self, cpu_ns: int, sent: int, now: float) -> None:
        if sent:
            self.dispatched += sent
            self.per_dispatch.append(cpu_ns / sent / 1000)


def measure(
    users: int,
    *,
    dispatches: int,
    backends: int = 100,
    use_baseline: bool = False,
    fairness: str = "vtc",
    deficit_bound: float = 0.0,
    groups: int = 0,
) -> Costs:
    """The costs with `users` backlogged (`groups`: users shared among that many groups, 0: none)."""
    started = time.monotonic()
    name = baseline.scan_name(fairness) if use_baseline else fairness
    gate = baseline.EVERY_PASS if use_baseline else "signals"
    engines = {
        (MODEL, f"b{i}"): SimConfig(
            max_num_seqs=8, scheduling_policy="priority" if PRIORITY_ENGINES else "fcfs", prefix_cache_blocks=4096
        )
        for i in range(backends)
    }
    timing = PassTimes()
    members = {f"u{u}": f"g{u % groups}" for u in range(users)} if groups else None
    sim = Simulation(config(backends, name, gate, deficit_bound, members), engines, [timing])
    core = sim.core
    for i in range(backends):  # every engine shown full: admission alone is measured first
        core.reading(MODEL, f"b{i}", waiting=100, running=8, tpot_seconds=0.02)
    core.settle()
    top_band_users = math.ceil(users / len(CLASSES))
    per_user = max(2, math.ceil(dispatches / top_band_users) + 2)
    admitted = 0
    admit_ns = 0
    for round_ in range(per_user):
        for user in range(users):
            cls = CLASSES[user % len(CLASSES)][0]
            prompt = f"user {user} asks about its own documents, turn {round_}. " * 4
            call = Call(core.now(), MODEL, f"u{user}", prompt, len(prompt) // 4, 16, cls)
            begin = time.process_time_ns()
            sim.arrive(call)
            admit_ns += time.process_time_ns() - begin
            admitted += 1
    timing.dispatched = 0  # admission's passes (nothing went) are counted in its own figure
    timing.per_dispatch.clear()
    admission_cpu_ns = sim.decision_cpu_ns
    sim.run_until(core.now() + 3600.0, stop=lambda: timing.dispatched >= dispatches)
    samples = sorted(timing.per_dispatch)
    return Costs(
        users=users,
        baseline=use_baseline,
        admitted=admitted,
        admission_us=admit_ns / admitted / 1000,
        dispatches=timing.dispatched,
        dispatch_us_median=statistics.median(samples) if samples else math.nan,
        dispatch_us_p90=samples[int(0.9 * (len(samples) - 1))] if samples else math.nan,
        decision_us_per_dispatch=(sim.decision_cpu_ns - admission_cpu_ns) / max(1, timing.dispatched) / 1000,
        wall_seconds=time.monotonic() - started,
    )

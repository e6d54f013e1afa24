"""S9's three parts at one size (full or quick), run in turn: their figures as plain data."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from bench.product import configure_logging
from bench.scenarios.s9 import baseline, day, decision_cost, memory

POLICIES = ("round_robin", "weighted_round_robin", "vtc", "vtc_basic")
DLPM_BOUND = 100.0  # D-LPM's window when on: about one request's vtc charge here (55 + 2 x 16 tokens)


@dataclass(frozen=True)
class S9Params:
    users: tuple[int, ...] = decision_cost.USERS
    baseline_users: tuple[int, ...] = (10, 100, 1_000)  # the walks put back grow with the users: kept small
    dispatches: int = 3000
    policy_users: tuple[int, int] = (10, 10_000)  # every policy and mode at these two sizes
    policy_dispatches: int = 1500
    day: day.DayParams = field(default_factory=day.DayParams)
    memory: memory.MemoryParams = field(default_factory=memory.MemoryParams)


QUICK = S9Params(
    users=(10, 100),
    baseline_users=(10,),
    dispatches=200,
    policy_users=(10, 100),
    policy_dispatches=100,
    day=day.QUICK,
    memory=memory.QUICK,
)


def policy_modes() -> list[tuple[str, float, int]]:
    """(policy, D-LPM bound, groups) for every policy with the locality window off and on, each without and
    (the weighted policies: round_robin has no weights) with the users in 100 shared groups."""
    return [
        (policy, bound, groups)
        for policy in POLICIES
        for groups in ((0,) if policy == "round_robin" else (0, 100))
        for bound in (0.0, DLPM_BOUND)
    ]


def run_parts(p: S9Params, *, log: bool = True) -> dict[str, Any]:
    """Every part; `log` prints each figure as it comes."""
    configure_logging("error")

    def say(text: str) -> None:
        if log:
            print(f"  {text}", flush=True)

    out: dict[str, Any] = {"decision_cost": [], "policies": [], "day": {}, "memory": None}
    with baseline.registered():
        for users in p.users:
            costs = decision_cost.measure(users, dispatches=p.dispatches)
            say(describe(costs))
            out["decision_cost"].append(dataclasses.asdict(costs))
        for users in p.baseline_users:
            costs = decision_cost.measure(users, dispatches=p.dispatches, use_baseline=True)
            say(describe(costs))
            out["decision_cost"].append(dataclasses.asdict(costs))
        for policy, bound, groups in policy_modes():
            row: dict[str, Any] = {"policy": policy, "deficit_bound": bound, "groups": groups}
            for users in p.policy_users:
                costs = decision_cost.measure(
                    users, dispatches=p.policy_dispatches, fairness=policy, deficit_bound=bound, groups=groups
                )
                row[str(users)] = dataclasses.asdict(costs)
            say(
                f"{policy} D-LPM {bound:g} groups {groups}: "
                + ", ".join(describe_short(row[str(u)]) for u in p.policy_users)
            )
            out["policies"].append(row)
    for setup, fifo in (("vtc", False), ("FIFO", True)):
        started = time.monotonic()
        out["day"][setup] = day.run_setup(p.day, fifo)
        say(f"day, {setup}: {time.monotonic() - started:.0f} s wall, {out['day'][setup]['arrived']} calls")
    measured = memory.measure_apart(p.memory)
    say(f"memory: RSS {measured.rss_after / 2**20:.0f} MiB, {measured.bytes_beyond_prompt:.0f} B beyond the prompt")
    out["memory"] = dataclasses.asdict(measured)
    return out


def describe(costs: decision_cost.Costs) -> str:
    return (
        f"{costs.users:>7} users{' (walks put back)' if costs.baseline else ''}: "
        f"admission {costs.admission_us:.1f} us, "
        f"dispatch median {costs.dispatch_us_median:.1f} us (p90 {costs.dispatch_us_p90:.1f}), all passes' CPU "
        f"per dispatch {costs.decision_us_per_dispatch:.1f} us"
    )


def describe_short(costs: dict[str, Any]) -> str:
    return f"{costs['users']} users {costs['dispatch_us_median']:.0f} us"

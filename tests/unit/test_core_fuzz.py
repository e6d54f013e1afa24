"""The whole core under seeded random configuration layouts and workloads (`core_fuzz`): every request ends
once, nothing runs twice, no internal error, no stall with free capacity, nothing of a drained request kept,
and two backlogged users share by the fairness policy's rule.

A fixed list of seeds keeps this fast; `python -m tests.unit.core_fuzz FIRST COUNT [--fair]` hunts over
many more. Among the seeds: a TPOT limit above an idle engine's step (5), a removed model whose backends
the file drains (138, 250), a client leaving a request whose backend a reload removes (272), and twenty
models with reloads (7, 23)."""

from __future__ import annotations

import pytest

from tests.unit.core_fuzz import run_fair_seed, run_seed

WORLD_SEEDS = [5, 7, 11, 23, 27, 138, 250, 272]
FAIR_SEEDS = [1, 3, 4, 5, 9, 10]


@pytest.mark.parametrize("seed", WORLD_SEEDS)
def test_a_random_layout_and_workload_keeps_every_promise(seed: int) -> None:
    world = run_seed(seed)
    assert world.admitted and world.dispatched, "the seed exercises dispatch"


@pytest.mark.parametrize("seed", FAIR_SEEDS)
def test_two_backlogged_users_share_by_the_fairness_policy(seed: int) -> None:
    world = run_fair_seed(seed)
    assert sum(world.served.values()) > 0

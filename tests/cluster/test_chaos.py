"""A few seeds of `chaos.run`: clients on every replica while replicas die, stop and start, the store goes away,
slows down or cuts one replica off, the engine fails requests and a replica reloads, with the cluster's
promises checked (see `tests/cluster/chaos.py`; `python -m tests.cluster.chaos FIRST COUNT` hunts further)."""

from __future__ import annotations

import pytest

from tests.cluster.chaos import run

SEEDS = (1, 2, 3)


@pytest.mark.parametrize("seed", SEEDS)
async def test_the_cluster_keeps_its_promises_under_seeded_faults(seed: int) -> None:
    verdict = await run(seed, seconds=3.0)
    assert not verdict.problems, "\n".join([*verdict.log, "problems:", *verdict.problems[:20]])
    assert verdict.outcomes["OK"] > 0

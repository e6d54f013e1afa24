"""Every scenario of the bench, in the order they run and docs/benchmarks.md lists them.

`python -m bench` runs what this registry selects; `scripts/gen_docs.py` renders `DEFINITIONS`. A new
scenario is one module declaring its `SCENARIO` (`bench.scenario.Scenario`) and one line in `SCENARIOS`.
"""

from __future__ import annotations

from collections.abc import Iterable

from bench.scenario import Definition, Scenario
from bench.scenarios import c1, c3, c4, c6, cb, cl, r1, s1, s3, s4, s5, s6, s7, s8
from bench.scenarios.s9 import scenario as s9

SCENARIOS: tuple[Scenario, ...] = (
    s1.SCENARIO,  # S1 and S2
    s3.SCENARIO,
    s4.SCENARIO,
    s5.SCENARIO,
    s6.SCENARIO,
    s7.SCENARIO,
    s8.SCENARIO,
    s9.SCENARIO,
    c1.SCENARIO,
    c3.SCENARIO,
    c4.SCENARIO,
    c6.SCENARIO,
    cb.SCENARIO,
    cl.SCENARIO,  # CL and CN
    r1.SCENARIO,  # real engines only, unless asked for by id
)
BY_ID = {scenario.id: scenario for scenario in SCENARIOS}
DEFINITIONS: tuple[Definition, ...] = tuple(d for scenario in SCENARIOS for d in scenario.definitions)
# the cluster scenarios: replicas side by side, and what a model's leader costs
CLUSTER = tuple(i for s in SCENARIOS if s.id.startswith("C") for i in s.produces)


def defaults(engine: str) -> list[str]:
    """The scenario ids a run on `engine` measures when it names none."""
    return [i for scenario in SCENARIOS if engine in scenario.engines for i in scenario.produces]


def select(ids: Iterable[str]) -> list[Scenario]:
    """The scenarios to run for ids such as ["S2", "S6"] (S2 comes with S1), in registry order."""
    wanted = set(ids)
    return [scenario for scenario in SCENARIOS if wanted & set(scenario.produces)]


def scenario_of(result_id: str) -> Scenario | None:
    """The scenario that produced a result ("S2" -> S1's entry; "R1 vllm, gpu_host, flood" -> R1)."""
    head = result_id.split()[0] if result_id else ""
    return next((s for s in SCENARIOS if head in s.produces), None)

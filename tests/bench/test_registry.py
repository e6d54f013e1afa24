"""The bench's shape: one registry every scenario plugs into, small modules, and one module through which the
bench reaches the service's internals (so a rename there touches one place here), with its core part apart
(`product_core`, for a process that must load the core alone)."""

from __future__ import annotations

import ast
import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench import registry, session
from bench.cli import parse
from bench.engines import Engine
from bench.results import ScenarioResult
from bench.scenario import Definition, Options, RealEngineOptions, Scenario

BENCH = Path(__file__).resolve().parents[2] / "bench"
MOST_LINES = 400
PRODUCT = ("scheduler_svc", "backends")
PRODUCT_MODULES = ("product.py", "product_core.py")


def _modules() -> list[Path]:
    return sorted(p for p in BENCH.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_bench_module_is_over_the_size_limit() -> None:
    sizes = {p.relative_to(BENCH).as_posix(): len(p.read_text().splitlines()) for p in _modules()}
    assert {name: n for name, n in sizes.items() if n > MOST_LINES} == {}


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_only_the_product_modules_import_the_service_and_the_adapters() -> None:
    reaching = {
        p.relative_to(BENCH).as_posix(): sorted(n for n in _imported(p) if n.split(".")[0] in PRODUCT)
        for p in _modules()
    }
    reaching_ones = {name for name, found in reaching.items() if found}
    assert reaching_ones == set(PRODUCT_MODULES)
    assert "bench.product_core" in _imported(BENCH / "product.py"), "product re-exports its core part"


def test_every_scenario_is_registered_once_with_its_definitions_in_docs_order() -> None:
    ids = [d.id for d in registry.DEFINITIONS]
    assert ids == ["S1", "S2", "S3", "S4", "S5", "S6", "S7", "S8", "S9", "C1", "C3", "C4", "C6", "CB", "CL", "CN", "R1"]
    assert [s for s, n in Counter(ids).items() if n > 1] == []
    assert registry.BY_ID["S1"].produces == ("S1", "S2")
    assert registry.BY_ID["CL"].produces == ("CL", "CN")
    assert all(registry.BY_ID[i].id == i for i in registry.BY_ID)
    files = [plot.file for scenario in registry.SCENARIOS for plot in scenario.plots]
    assert [f for f, n in Counter(files).items() if n > 1] == []


def test_each_engine_runs_its_own_scenarios_by_default() -> None:
    simulator = ["S1", "S2", "S3", "S4", "S5", "S6", "S7", "S8", "S9", "C1", "C3", "C4", "C6", "CB", "CL", "CN"]
    assert registry.defaults("sim") == simulator
    assert registry.defaults("vllm") == ["S6", "S8", "R1"]
    assert registry.defaults("llamacpp") == ["R1"]


def test_selection_by_id_and_the_scenario_a_result_came_from() -> None:
    assert [s.id for s in registry.select(["S2"])] == ["S1"]  # S2 comes with S1
    assert [s.id for s in registry.select(["R1", "S6", "X9"])] == ["S6", "R1"]
    assert registry.select([]) == []
    assert registry.scenario_of("S2") is registry.BY_ID["S1"]
    assert registry.scenario_of("R1 vllm, gpu_host, flood") is registry.BY_ID["R1"]
    assert registry.scenario_of("") is None and registry.scenario_of("X9") is None


def test_r1s_knobs_reach_its_options_and_bad_ones_are_refused() -> None:
    args = parse(["--scenarios", "R1", "--layouts", "gpu_host", "--rounds", "1", "--setups", "sched,fifo"])
    assert args.real == RealEngineOptions(("gpu_host",), ("flood",), 1, ("sched", "fifo"), 0, None)
    assert parse([]).real == RealEngineOptions()
    for bad in (["--layouts", "gpu_hots"], ["--workloads", "flod"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            parse(bad)


def _definition(id: str) -> Definition:
    return Definition(id, f"title {id}", "?", "-", "-", "-", (), "-", "-")


class _Provider:
    name = "sim"
    closed = False

    def describe(self) -> str:
        return "no engine"

    def engine(self, scheduling_policy: str = "fcfs") -> contextlib.AbstractAsyncContextManager[Engine]:
        raise AssertionError("the fake scenarios start no engine")

    async def aclose(self) -> None:
        self.closed = True


async def test_a_failing_scenario_is_reported_not_available_and_the_others_still_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async def broken(provider: Any, options: Options) -> list[ScenarioResult]:
        raise RuntimeError("engine on fire")

    async def working(provider: Any, options: Options) -> list[ScenarioResult]:
        return [ScenarioResult("X2", "title X2", "w"), ScenarioResult("X3 layout", "title X3", "w", seconds=7.5)]

    scenarios = (Scenario((_definition("X1"),), broken), Scenario((_definition("X2"), _definition("X3")), working))
    monkeypatch.setattr(registry, "SCENARIOS", scenarios)
    provider = _Provider()
    out = await session.run_all(provider, ["X1", "X3"], Options(tmp_path))
    assert [(r.id, r.title, r.available) for r in out] == [("X1", "title X1", False), ("X3 layout", "title X3", True)]
    assert "engine on fire" in out[0].reason
    assert out[1].seconds == 7.5  # a scenario that times its parts itself (R1, per layout) keeps its figure
    assert provider.closed

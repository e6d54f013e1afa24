"""How a scenario plugs into the bench: one `Scenario` value per scenario, listed once in `bench.registry`.

A scenario is its definitions (`Definition`: what a reader needs, the question it answers, its workload, the
layout it runs on, what it measures, its targets, how to run it and what its runs have shown; S1's entry
also declares S2, which its runs measure too; `scripts/gen_docs.py` renders them with the latest record of
each into docs/benchmarks.md, and the numbers in a definition come from the scenario's own parameters where
they can, so the text follows the code), one run function that takes an engine provider and the run's
`Options` and returns a `ScenarioResult` per definition (its table, figures against their targets, notes,
raw figures and plot series), the engines whose default run includes it, and the plots drawn from its
results' series. `python -m bench` knows nothing else about a scenario: adding one is a module that
declares its `SCENARIO` and one line in the registry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bench.cluster import ClusterOptions
from bench.engines import EngineProvider
from bench.results import ScenarioResult


@dataclass(frozen=True)
class Definition:
    """One scenario as a reader needs it."""

    id: str  # "S1"; a record's scenario ids start with it ("R1 vllm, gpu_host, flood")
    title: str
    question: str  # what it answers, in one sentence
    workload: str
    layout: str  # the engine, the processes and the setups compared side by side
    measures: str
    targets: tuple[str, ...]
    duration: str  # about how long one run takes
    command: str = ""  # how to run it alone (default: `python -m bench --scenarios ID`)
    facts: tuple[str, ...] = ()  # what its runs have shown, as present-tense facts
    headline: tuple[str, ...] = ()  # the figures (Target.figure) the README's results table shows

    def __post_init__(self) -> None:
        if not self.command:
            object.__setattr__(self, "command", f"python -m bench --scenarios {self.id}")


@dataclass(frozen=True)
class RealEngineOptions:
    """R1's knobs (real engines laid out on the machine's cores)."""

    layouts: tuple[str, ...] = ("gpu_host", "starved", "shared")
    workloads: tuple[str, ...] = ("flood",)
    rounds: int = 3  # every setup once per round
    setups: tuple[str, ...] = ()  # only these setup keys, and those run on request (empty: the engine's own)
    flood: int = 0  # the flood's size (0: the workload's)
    baseline_src: Path | None = None  # another source tree, run as the `sched_base` setup


@dataclass(frozen=True)
class Options:
    """What `python -m bench` passes to every scenario besides the engine provider."""

    out_dir: Path
    engine: str = "sim"  # "sim", "vllm" or "llamacpp"
    profile: bool = False  # S6: also profile the scheduler
    cluster: ClusterOptions = field(default_factory=ClusterOptions)
    real: RealEngineOptions = field(default_factory=RealEngineOptions)


Run = Callable[[EngineProvider, Options], Awaitable[list[ScenarioResult]]]


@dataclass(frozen=True)
class Plot:
    """One PNG drawn from a result's `series` (`bench.plots`):

    - "ttft": each request's time to first token against when it came (`background`: the tag drawn in grey);
    - "engine": the engine's queue and batch over time, with the gate's target where the series has one;
    - "tokens": output tokens served per user over time, the measuring window shaded.
    """

    kind: Literal["ttft", "engine", "tokens"]
    file: str
    title: str
    background: str = ""


@dataclass(frozen=True)
class Scenario:
    """One entry of the bench."""

    definitions: tuple[Definition, ...]  # the first is the entry's own; its runs produce one result each
    run: Run
    engines: tuple[str, ...] = ("sim",)  # the engines whose default run (no --scenarios) includes it
    plots: tuple[Plot, ...] = ()

    @property
    def id(self) -> str:
        return self.definitions[0].id

    @property
    def produces(self) -> tuple[str, ...]:
        """The scenario ids its results carry (a result's id starts with one: "R1 vllm, gpu_host, flood")."""
        return tuple(d.id for d in self.definitions)

    def title(self, scenario_id: str) -> str:
        return next(d.title for d in self.definitions if d.id == scenario_id)

"""The benchmark scenarios, by id. S1's runs also give S2, so one entry produces both. C1, C3, C4, C6 and CB
are the cluster variants (several scheduler replicas in front of one engine); CL measures what the cluster's
leaders cost per follower request, CN one leader under many followers' load."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.engines import EngineProvider
from bench.results import ScenarioResult
from bench.scenarios import c1, c3, c4, c6, cb, cl, real_s1, s1, s3, s4, s5, s6, s7, s8
from bench.scenarios._cluster import ClusterOptions
from bench.scenarios.definition import Definition


@dataclass(frozen=True)
class Options:
    """What `python -m bench` passes through to the scenarios."""

    out_dir: Path
    profile: bool = False
    cluster: ClusterOptions = field(default_factory=ClusterOptions)


Runner = Callable[[EngineProvider, Options], Awaitable[list[ScenarioResult]]]

# entry id -> (the scenario ids it produces, how to run it)
SCENARIOS: dict[str, tuple[tuple[str, ...], Runner]] = {
    "S1": (("S1", "S2"), lambda provider, options: s1.run(provider)),
    "S3": (("S3",), lambda provider, options: s3.run(provider)),
    "S4": (("S4",), lambda provider, options: s4.run(provider)),
    "S5": (("S5",), lambda provider, options: s5.run(provider)),
    "S6": (("S6",), lambda provider, options: s6.run(provider, profile=options.profile, out_dir=options.out_dir)),
    "S7": (("S7",), lambda provider, options: s7.run(provider)),
    "S8": (("S8",), lambda provider, options: s8.run(provider)),
    "C1": (("C1",), lambda provider, options: c1.run(provider, options.cluster)),
    "C3": (("C3",), lambda provider, options: c3.run(provider, options.cluster)),
    "C4": (("C4",), lambda provider, options: c4.run(provider, options.cluster)),
    "C6": (("C6",), lambda provider, options: c6.run(provider, options.cluster)),
    "CB": (("CB",), lambda provider, options: cb.run(provider, options.cluster)),
    "CL": (("CL", "CN"), lambda provider, options: cl.run(provider, options.cluster)),
}

TITLES = {
    "S1": "flood + latecomers",
    "S2": "utilisation",
    "S3": "weighted shares",
    "S4": "token fairness",
    "S5": "priority classes",
    "S6": "overhead",
    "S7": "faults",
    "S8": "locality across replicas",
    "C1": c1.TITLE,
    "C3": c3.TITLE,
    "C4": c4.TITLE,
    "C6": c6.TITLE,
    "CB": cb.TITLE,
    "CL": cl.TITLE,
    "CN": cl.LOAD_TITLE,
}
CLUSTER = ("C1", "C3", "C4", "C6", "CB", "CL", "CN")

# R1 (S1/S2 on a real engine in three core layouts: bench/scenarios/real_s1.py) runs outside this table.
DEFAULT = {"sim": ("S1", "S3", "S4", "S5", "S6", "S7", "S8", *CLUSTER), "vllm": ("R1", "S6", "S8"), "llamacpp": ("R1",)}


def entries_for(ids: list[str]) -> list[str]:
    """The entries to run for scenario ids such as ["S2", "S6"] (S2 comes with S1)."""
    wanted = []
    for entry, (produces, _) in SCENARIOS.items():
        if any(i in produces for i in ids):
            wanted.append(entry)
    return wanted


# Every scenario the bench runs, as docs/benchmarks.md lists them (scripts/gen_docs.py renders them in this order).
DEFINITIONS: tuple[Definition, ...] = (
    s1.DEFINITION,
    s1.UTILISATION,
    s3.DEFINITION,
    s4.DEFINITION,
    s5.DEFINITION,
    s6.DEFINITION,
    s7.DEFINITION,
    s8.DEFINITION,
    c1.DEFINITION,
    c3.DEFINITION,
    c4.DEFINITION,
    c6.DEFINITION,
    cb.DEFINITION,
    cl.DEFINITION,
    cl.LOAD_DEFINITION,
    real_s1.DEFINITION,
)

"""What the cluster scenarios (C1, C3, C4, C6, CB) share: their layouts side by side in one run, and labels.

Each runs the same workload through one scheduler process (the reference), through N independent processes
side by side (memory mode: each gates and orders alone) and through N replicas meeting on Redis (one
scheduler), clients spread round robin over the replicas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from bench.cluster import Layout
from bench.runner import ConfigBuilder, Mode, RunContext

T = TypeVar("T")


def label(layout: Layout) -> str:
    """A run's label: what the scheduler side is (the report drops the leading "scheduler, ")."""
    if layout.store == "memory" and layout.replicas > 1:
        return f"scheduler, {layout.label} (independent processes)"
    if layout.store == "redis" and layout.replicas > 1:
        return f"scheduler, {layout.label} (one cluster)"
    return f"scheduler, {layout.label}"


def modes(config: ConfigBuilder, layouts: Sequence[Layout], engine_policy: str = "fcfs") -> list[Mode]:
    return [Mode(label(layout), engine_policy=engine_policy, config=config, layout=layout) for layout in layouts]


def is_cluster(run_label: str) -> bool:
    """The runs the issue's targets are about: replicas on Redis."""
    return ", redis" in run_label


def is_reference(run_label: str) -> bool:
    """The one-process run every cluster figure is compared with."""
    return run_label == label(Layout(1, "memory"))


def reference(runs: Mapping[str, T]) -> T | None:
    """The one-process run's figures, if it ran."""
    return next((r for run_label, r in runs.items() if is_reference(run_label)), None)


async def spread(run: RunContext) -> list[Any]:
    """Requests each replica admitted in the run (its own counter, warm-up included): the round robin at work."""
    if run.cluster is None:
        return []
    return [None if n is None else int(n) for n in await run.cluster.admitted()]


def spread_text(counts: Sequence[Any]) -> str:
    return " / ".join("-" if n is None else str(n) for n in counts) or "-"

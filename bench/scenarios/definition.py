"""What a benchmark scenario is, declared beside its code: the question it answers, its workload, the
layout it runs on, what it measures, its targets, how to run it, and what its runs have shown.

Each scenario module declares its `DEFINITION` (S1's declares S1's and S2's); `bench.scenarios.DEFINITIONS`
lists them in order, and `scripts/gen_docs.py` renders them, with the latest record of each, into
docs/benchmarks.md. The numbers in a definition come from the module's own parameters where they can, so
the text follows the code.
"""

from __future__ import annotations

from dataclasses import dataclass


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

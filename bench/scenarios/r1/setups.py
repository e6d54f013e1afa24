"""R1's workloads and setups: the flood with its latecomers (one seeded plan per round, the same for every
setup of the round), and the setups interleaved on one engine: the scheduler, the engine's own priority
queue (the oracle), its FIFO, the scheduler without engine priorities, and those run only on request."""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.product import SHIPPED_SCRAPE_INTERVAL

SLOTS = 4
GATE_TARGET = 3
PRIORITY_GATE_TARGET = 6  # the queue a latecomer jumps at a priority engine: what the gate derives at 4 slots


@dataclass(frozen=True)
class Workload:
    name: str
    flood: int = 64
    tokens_min: int = 256
    tokens_max: int = 256
    latecomers: int = 30  # besides B and C
    latecomer_tokens: int = 16

    def describe(self) -> str:
        lengths = (
            f"exactly {self.tokens_min}"
            if self.tokens_min == self.tokens_max
            else f"{self.tokens_min}-{self.tokens_max}"
        )
        return (
            f"user A floods {self.flood} streamed requests of {lengths} tokens (ignore_eos); B and C send one "
            f"each at +1 s and +2 s, {self.latecomers} more latecomers (distinct users, {self.latecomer_tokens} "
            "tokens) at random offsets through the flood"
        )


WORKLOADS = {"flood": Workload("flood"), "mixed": Workload("mixed", tokens_min=32, tokens_max=512)}


@dataclass(frozen=True)
class Setup:
    key: str
    label: str
    scheduled: bool
    engine_priorities: bool = False
    latecomer_priority: int | None = None
    baseline: bool = False
    event_loop: str = "uvloop"  # the scheduler's server.event_loop
    read_interval: float | None = None  # its server.stream_read_interval_seconds (None: the shipped default)
    group_at_engine: bool | None = None  # its server.stream_group_at_engine (None: the shipped default)
    waiting_target: int = GATE_TARGET  # the gate's waiting target (at an engine without priorities, all it has)
    adapt_seconds: float | None = None  # its gate.waiting_target_adapt_seconds (None: the shipped default)
    scrape_interval: float = SHIPPED_SCRAPE_INTERVAL  # how often the scheduler reads the engine's metrics
    first_config: str = ""  # a user's first config instead of the bench's: minimal, minimal_slots, example


SCHED = Setup("sched", "scheduler, engine priorities on", True, engine_priorities=True)
ORACLE = Setup("oracle", "vLLM priority queue, latecomers -1 (oracle)", False, latecomer_priority=-1)
FIFO = Setup("fifo", "engine FIFO, direct", False)
SCHED_OFF = Setup("sched_off", "scheduler, engine priorities off (pure gating)", True)
SCHED_BASE = Setup("sched_base", "scheduler from --baseline-src, engine priorities on", True, True, baseline=True)
SCHED_ASYNCIO = Setup(
    "sched_asyncio", "scheduler on asyncio's loop, engine priorities on", True, True, event_loop="asyncio"
)
SCHED_EVERY_TOKEN = Setup(
    "sched_every_token", "scheduler reading every token as it arrives, priorities on", True, True, read_interval=0.0
)
SCHED_PACED = Setup(
    "sched_paced", "scheduler with tokens grouped within 50 ms, priorities on", True, True, read_interval=0.05
)
SCHED_READ_PACED = Setup(
    "sched_read_paced",
    "scheduler reading at most every 50 ms, engine sends every token, priorities on",
    True,
    True,
    read_interval=0.05,
    group_at_engine=False,
)
SCHED_OFF_TARGET_1 = Setup(
    "sched_off_target_1", "scheduler, engine priorities off, waiting target 1", True, waiting_target=1
)
SCHED_OFF_FIXED = Setup(
    "sched_off_fixed", "scheduler, engine priorities off, waiting target held at 3", True, adapt_seconds=0.0
)
SCHED_SCRAPE_01 = Setup(
    "sched_scrape_01",
    "scheduler reading the engine's metrics every 0.1 s, priorities on",
    True,
    True,
    scrape_interval=0.1,
)
# A user's first config against a priority vLLM, each as written, with none of the bench's own settings
FIRST_MINIMAL = Setup(
    "first_minimal", "minimal config (model + priority vLLM backend)", True, True, first_config="minimal"
)
FIRST_MINIMAL_SLOTS = Setup(
    "first_minimal_slots", "minimal config + max_num_seqs = 4", True, True, first_config="minimal_slots"
)
FIRST_EXAMPLE = Setup("first_example", "configs/example.toml", True, True, first_config="example")
FIRST_MINIMAL_BASE = Setup(
    "first_minimal_base",
    "minimal config, scheduler from --baseline-src",
    True,
    True,
    baseline=True,
    first_config="minimal",
)
# run only when --setups names them
ON_REQUEST = (
    FIRST_MINIMAL,
    FIRST_MINIMAL_SLOTS,
    FIRST_EXAMPLE,
    FIRST_MINIMAL_BASE,
    SCHED_SCRAPE_01,
    SCHED_ASYNCIO,
    SCHED_EVERY_TOKEN,
    SCHED_PACED,
    SCHED_READ_PACED,
    SCHED_OFF_TARGET_1,
    SCHED_OFF_FIXED,
)


def result_suffix(setups: list[Setup]) -> str:
    """What a run's result id adds after the workload: a run of a user's first configs is a result of its own
    (`R1 vllm, gpu_host, flood, first configs`), so its record never stands in for the standard setups'."""
    return ", first configs" if any(s.first_config for s in setups) else ""


def setups_for(engine: str, baseline: bool) -> list[Setup]:
    if engine == "llamacpp":
        return [SCHED_OFF, FIFO]
    return [SCHED, ORACLE, FIFO, SCHED_OFF, *([SCHED_BASE] if baseline else [])]


@dataclass(frozen=True)
class Plan:
    """What one round sends, the same for every setup of the round."""

    flood_tokens: list[int]
    latecomers: list[tuple[str, float]]  # (user, offset in seconds after the flood's first send)


def make_plan(workload: Workload, seed: int, late_until: float) -> Plan:
    rng = random.Random(seed)
    tokens = [rng.randint(workload.tokens_min, workload.tokens_max) for _ in range(workload.flood)]
    late = [("B", 1.0), ("C", 2.0)]
    late += [(f"L{seed}-{i:02d}", rng.uniform(0.5, late_until)) for i in range(workload.latecomers)]
    return Plan(tokens, sorted(late, key=lambda item: item[1]))


def latecomers_until(workload: Workload, tokens_per_second: float) -> float:
    """Until when latecomers arrive: through about 80% of the flood at the calibrated full-batch rate."""
    mean = sum(range(workload.tokens_min, workload.tokens_max + 1)) / (workload.tokens_max - workload.tokens_min + 1)
    return max(3.0, 0.8 * workload.flood * mean / tokens_per_second)

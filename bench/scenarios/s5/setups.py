"""S5's setups: the two classes (interactive with a TPOT limit, batch only while the engine's queue is empty),
the runs side by side, and the scheduler in front of the slow-stepping engine for the TPOT flood."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.configs import SCHEDULED_MODEL, for_engine, scheduler_config
from bench.engines import Engine
from bench.runner import ConfigBuilder, Mode
from bench.scenarios.s5.tpot_flood import SLOW_STEPPING

TITLE = "priority classes"
DIRECT_FIFO = "engine alone (FIFO)"
IDLE_BASELINE = "engine alone, interactive only (no batch flood: the idle baseline)"
DIRECT_PRIORITY = "engine alone (priority, interactive -1)"
THROUGHPUT_FIRST = "scheduler, throughput first (batch <= 3/4 of slots)"
LATENCY_FIRST = "scheduler, latency first (batch <= 1/4 of slots while interactive is active)"
IDLE_PROBES = 9
CONTENTION_WINDOW = 5.0  # seconds of interactive quiet before batch may fill up again
TPOT_LIMIT = 0.15
CLASSES = [
    {"name": "interactive", "rank": 0, "engine_priority": 0, "max_tpot_seconds": TPOT_LIMIT},
    {
        "name": "batch",
        "rank": 1,
        "engine_priority": 10,
        "require_idle_engine": True,
        "starvation_after_seconds": 60.0,
    },
]


@dataclass(frozen=True)
class S5Params:
    batch_requests: int = 200  # the batch user's flood, all sent at 0 s
    batch_tokens_min: int = 100  # each batch answer's length is drawn from min-max (seeded)
    batch_tokens_max: int = 200
    interactive_rate: float = 4.0  # interactive requests a second, Poisson arrivals
    interactive_tokens: int = 32  # each interactive answer
    interactive_prompt_tokens: int = 512  # a chat turn: system prompt and history (about 4 characters a token)
    interactive_start: float = 1.0  # seconds into the batch flood when interactive traffic starts ...
    interactive_end: float = 13.0  # ... and when it stops
    timeout: float = 60.0  # for the batch to finish once interactive traffic stopped
    seed: int = 5  # of the batch lengths and the arrivals
    # the TPOT-hold flood: interactive streams from 4 users against the slow-stepping engine (16 slots,
    # 40 ms + 10 ms per running request a step: 11 running give the 150 ms limit)
    tpot_flood_requests: int = 40
    tpot_flood_tokens: int = 100
    tpot_flood_users: int = 4


def classes(max_num_seqs: int, latency_first: bool) -> list[dict[str, Any]]:
    """The classes. A quarter of the engine's slots is always kept free of batch work for interactive
    arrivals (engines do not preempt a running request for a waiting one); latency first also holds batch
    to a quarter of the slots while interactive traffic is around."""
    if max_num_seqs <= 1:  # the engine's batch size is unknown: no slot limits
        return CLASSES
    batch = {**CLASSES[1], "max_engine_running": max_num_seqs - max(1, max_num_seqs // 4)}
    if latency_first:
        batch["max_engine_running_when_contended"] = max(1, max_num_seqs // 4)
        batch["contention_window_seconds"] = CONTENTION_WINDOW
    return [CLASSES[0], batch]


def tpot_flood_config(engine_url: str, engine_model: str) -> dict[str, Any]:
    """The scheduler in front of the slow-stepping engine (16 slots) for the interactive TPOT flood."""
    return scheduler_config(
        engine_url=engine_url,
        model=SCHEDULED_MODEL,
        engine_model=engine_model,
        max_num_seqs=int(SLOW_STEPPING["max_num_seqs"]),
        classes=CLASSES,
        default_class="interactive",
    )


def config(latency_first: bool) -> ConfigBuilder:
    """The scheduler with S5's classes, sized to the engine's slots; interactive unless a request says."""

    def build(engine: Engine) -> dict[str, Any]:
        return for_engine(engine, classes=classes(engine.max_num_seqs, latency_first), default_class="interactive")

    return build


def modes() -> list[Mode]:
    return [
        Mode(DIRECT_PRIORITY, engine_policy="priority"),
        Mode(DIRECT_FIFO),
        Mode(IDLE_BASELINE),
        Mode(THROUGHPUT_FIRST, config=config(False)),
        Mode(LATENCY_FIRST, config=config(True)),
    ]

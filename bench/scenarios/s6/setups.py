"""S6's setups: the instant engine, the runs side by side in every round, the scheduler's config and the
rates (a CPU vLLM takes far fewer requests a second)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from bench import harness
from bench.configs import STANDARD_CLASS, Toml, for_engine
from bench.engines import Engine
from bench.runner import Mode

TITLE = "overhead"
DIRECT = "engine alone"
ECHO = "bare gRPC echo"
SCHEDULED = "scheduler, round_robin"
HTTP = "scheduler through HTTP, round_robin"
HTTP_RATIO = 1.5  # target: added latency p50 through the HTTP door at most 1.5x the gRPC door's
PROFILED = "scheduler under pyinstrument"


@dataclass(frozen=True)
class S6Params:
    tokens: int = 16  # every answer, streamed at once by the instant engine
    rate: float = 300.0  # the target phase's requests a second (open loop)
    low_rate: float = 50.0  # the low phase's
    warmup: float = 1.0  # seconds at the low rate before the phases
    duration: float = 5.0  # seconds of each phase
    ceiling_concurrency: int = 64  # clients back to back for the ceiling ...
    ceiling_duration: float = 4.0  # ... measured this long
    timeout: float = 60.0  # for a phase's requests to end
    rounds: int = 3  # each round runs every mode once, in turn: the medians compare interleaved runs


VLLM_PARAMS = S6Params(
    rate=8.0,
    low_rate=2.0,
    warmup=2.0,
    duration=10.0,
    ceiling_concurrency=8,
    ceiling_duration=8.0,
    timeout=120.0,
    rounds=1,
)


class FakeProvider:
    """`bench.servers.fake_engine` subprocesses: an engine with no decode time at all."""

    name = "fake"

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    def describe(self) -> str:
        return f"instant fake engine (bench/servers/fake_engine.py): {self.tokens} tokens streamed at once, no queue"

    @contextlib.asynccontextmanager
    async def engine(self, scheduling_policy: str = "fcfs") -> AsyncIterator[Engine]:
        async with harness.fake_engine(self.tokens) as url:
            yield Engine(url, "fake-model", scheduling_policy)

    async def aclose(self) -> None:
        return None


def config(engine: Engine) -> Toml:
    """round_robin, one class, a waiting target of 3; the gate is not told the engine's batch size (S6 measures
    the scheduler's own cost, not the gate's sizing; the instant engine has none)."""
    return for_engine(engine, classes=STANDARD_CLASS, waiting_target=3, max_num_seqs=0)


def modes() -> list[Mode]:
    """Every round: the engine alone, the echo, the scheduler by gRPC and by its HTTP door."""
    return [
        Mode(DIRECT),
        Mode(ECHO, echo=True),
        Mode(SCHEDULED, config=config),
        Mode(HTTP, config=config, http=True),
    ]

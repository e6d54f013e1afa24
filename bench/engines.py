"""The engines a benchmark runs against: the simulator with a GPU-like timing profile, or real CPU vLLM.

A scenario asks its provider for an engine with a scheduling policy ("fcfs" or "priority") once per run.
The simulator starts fresh each time (a second, and no state carried over); a real vLLM takes a minute or
two to start, so it is started once per policy, reused across runs after its queue drains, and only one
is alive at a time on this small machine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from bench import harness
from bench.clients import RunClock
from bench.probe import EngineProbe
from engines import EngineProcess, vllm_missing_reason, vllm_process


@dataclass(frozen=True)
class Engine:
    """A running engine as the load generator and the scheduler config need it."""

    url: str
    model: str
    scheduling_policy: str
    max_num_seqs: int = 0  # the engine's batch size, told to the scheduler's gate (0: unknown)


@dataclass(frozen=True)
class SimProfile:
    """The simulator's timing: a step costs base + per-seq * batch (+ prefill), like a GPU's decode."""

    max_num_seqs: int = 64  # slots: requests decoded together
    decode_base_ms: float = 20.0  # a decode step's fixed cost ...
    decode_per_seq_ms: float = 0.3  # ... and its cost per running request
    prefill_per_token_ms: float = 0.05  # per prompt token, in the step that takes the request in

    def step_seconds(self, batch: int) -> float:
        return (self.decode_base_ms + self.decode_per_seq_ms * batch) / 1000.0

    def flags(self, scheduling_policy: str) -> list[str]:
        return [
            "--max-num-seqs", str(self.max_num_seqs),
            "--decode-base-ms", str(self.decode_base_ms),
            "--decode-per-seq-ms", str(self.decode_per_seq_ms),
            "--prefill-per-token-ms", str(self.prefill_per_token_ms),
            "--scheduling-policy", scheduling_policy,
        ]  # fmt: skip

    def describe(self) -> str:
        return (
            f"simulated vLLM, max_num_seqs {self.max_num_seqs}, decode step {self.decode_base_ms:g} ms "
            f"+ {self.decode_per_seq_ms:g} ms per running request ({self.step_seconds(1) * 1000:.1f} ms at batch 1, "
            f"{self.step_seconds(self.max_num_seqs) * 1000:.1f} ms full), prefill "
            f"{self.prefill_per_token_ms:g} ms per prompt token"
        )


class EngineProvider(Protocol):
    """Hands out engines for runs; `name` is "sim" or "vllm"."""

    name: str

    def describe(self) -> str: ...

    def engine(self, scheduling_policy: str = "fcfs") -> contextlib.AbstractAsyncContextManager[Engine]: ...

    async def aclose(self) -> None: ...


class SimProvider:
    """A fresh `llmsched sim` subprocess per run."""

    name = "sim"

    def __init__(self, profile: SimProfile) -> None:
        self.profile = profile

    def describe(self) -> str:
        return self.profile.describe()

    @contextlib.asynccontextmanager
    async def engine(self, scheduling_policy: str = "fcfs") -> AsyncIterator[Engine]:
        async with harness.simulator(*self.profile.flags(scheduling_policy)) as url:
            yield Engine(url, "sim-model", scheduling_policy, self.profile.max_num_seqs)

    async def aclose(self) -> None:
        return None


class VllmProvider:
    """Real vLLM on CPU (the `engines` package), one process per scheduling policy, reused across runs."""

    name = "vllm"

    def __init__(self, max_num_seqs: int = 4) -> None:
        self.max_num_seqs = max_num_seqs
        self._running: dict[str, EngineProcess] = {}  # by scheduling policy

    @staticmethod
    def missing_reason() -> str | None:
        """None when the real vLLM is installed, else why not (and how to install it)."""
        return vllm_missing_reason()

    def describe(self) -> str:
        return f"real vLLM (CPU, tiny random-weight Llama), max_num_seqs {self.max_num_seqs}"

    @contextlib.asynccontextmanager
    async def engine(self, scheduling_policy: str = "fcfs") -> AsyncIterator[Engine]:
        for policy in [p for p in self._running if p != scheduling_policy]:
            await asyncio.to_thread(self._running.pop(policy).stop)  # one vLLM at a time on 2 cores
        process = self._running.get(scheduling_policy)
        if process is None:
            process = vllm_process(
                scheduling_policy=scheduling_policy,
                served_model_name=f"tiny-llama-{scheduling_policy}",
                max_num_seqs=self.max_num_seqs,
            )
            await asyncio.to_thread(process.start)
            self._running[scheduling_policy] = process
        engine = Engine(process.url, process.served_model_name, scheduling_policy, self.max_num_seqs)
        try:
            yield engine
        finally:
            await _drain(engine)

    async def aclose(self) -> None:
        for process in self._running.values():
            await asyncio.to_thread(process.stop)
        self._running.clear()


async def _drain(engine: Engine, timeout: float = 60.0) -> None:
    """Wait for aborted requests to leave a reused engine before the next run starts."""
    async with aiohttp.ClientSession() as session:
        await EngineProbe(session, engine.url, RunClock()).wait_idle(timeout)

"""S8's engine replicas: two engines of one model, each with a prefix cache holding about half of the
working set, on the simulator or on real CPU vLLM.

A replica pair is entered once per scenario (`session`, where real engines start: a minute each) and once
per run (`run`, which yields the replicas' URLs). The simulators start fresh for every run (a second; their
caches and counters start empty). The vLLM servers are started once, each pinned to its own core, and
between runs their queues drain and their prefix caches are emptied (`POST /reset_prefix_cache`, which
vLLM serves with `VLLM_SERVER_DEV_MODE=1`), so no setup inherits another's cache; the figures are counter
deltas over each run's window, so the counters need no reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from bench import harness
from bench.clients import RunClock
from bench.engines import SimProfile
from bench.probe import EngineProbe
from engines import EngineProcess, layout, vllm_process

REPLICAS = 2


@dataclass(frozen=True)
class Replica:
    """One running engine of the pair."""

    url: str
    model: str


class ReplicaPair(Protocol):
    """Two engines of one model for S8's runs."""

    @property
    def name(self) -> str: ...

    @property
    def max_num_seqs(self) -> int: ...

    def describe(self) -> str: ...

    def session(self) -> contextlib.AbstractAsyncContextManager[None]: ...

    def run(self) -> contextlib.AbstractAsyncContextManager[list[Replica]]: ...


@dataclass(frozen=True)
class SimReplicas:
    """Two fresh `llmsched sim` processes per run, with prefix caches of `prefix_cache_blocks` blocks."""

    profile: SimProfile
    prefix_cache_blocks: int
    name: str = "sim"

    @property
    def max_num_seqs(self) -> int:
        return self.profile.max_num_seqs

    def flags(self) -> list[str]:
        return [*self.profile.flags("fcfs"), "--prefix-cache-blocks", str(self.prefix_cache_blocks)]

    def describe(self) -> str:
        prefill = self.profile.prefill_per_token_ms
        return (
            f"two {self.profile.describe()} ({prefill * 1000:g} ms for a 1,000-token prompt), each with a prefix "
            f"cache of {self.prefix_cache_blocks} blocks of 16 tokens"
        )

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        yield

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[list[Replica]]:
        async with contextlib.AsyncExitStack() as stack:
            urls = [await stack.enter_async_context(harness.simulator(*self.flags())) for _ in range(REPLICAS)]
            yield [Replica(url, "sim-model") for url in urls]


@dataclass(frozen=True)
class VllmReplicaSpec:
    """How one CPU vLLM replica is started: its core, KV-cache size in blocks, and command-line extras."""

    index: int
    core: int
    kv_blocks: int
    block_size: int
    max_num_seqs: int
    max_model_len: int

    @property
    def served_model_name(self) -> str:
        return f"tiny-llama-r{self.index}"

    def extra_args(self) -> list[str]:
        return [
            "--enable-prefix-caching",
            "--block-size", str(self.block_size),
            "--num-gpu-blocks-override", str(self.kv_blocks),
        ]  # fmt: skip

    def layout(self) -> layout.Layout:
        """All of this replica (front end and compute) on its own core; the scheduler and load unpinned."""
        core = frozenset({self.core})
        return layout.Layout(
            f"s8-r{self.index}", f"replica {self.index} on core {self.core}", None, core, core, str(self.core)
        )


def vllm_kv_blocks(*, users: int, system_tokens: int, request_tokens: int, max_num_seqs: int, block_size: int) -> int:
    """KV blocks for one replica: half of the users' system prompts (the working set) plus, per batch slot, the
    blocks a request adds beyond its system prompt (question and answer), so a full batch fits without
    preemption while the cache can keep about half of the prompts."""
    half_working_set = math.ceil(users * system_tokens / 2 / block_size)
    per_slot = math.ceil(request_tokens / block_size) + 1
    return half_working_set + max_num_seqs * per_slot


def vllm_specs(
    *, users: int, system_tokens: int, request_tokens: int, max_num_seqs: int = 4, block_size: int = 32
) -> list[VllmReplicaSpec]:
    """The two replicas: replica i on core i (of a 2-core machine), the same KV size each. Block size 32: vLLM's
    CPU backend prefers multiples of 32 (its default, 128, would make each prompt's last partial block, up to
    127 tokens, never cached)."""
    blocks = vllm_kv_blocks(
        users=users,
        system_tokens=system_tokens,
        request_tokens=request_tokens,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
    )
    max_model_len = 1 << max(10, math.ceil(math.log2(system_tokens + request_tokens + 1)))
    return [VllmReplicaSpec(i, i, blocks, block_size, max_num_seqs, max_model_len) for i in range(REPLICAS)]


def vllm_replica_process(spec: VllmReplicaSpec) -> EngineProcess:
    """Build (not start) the replica's vLLM server, pinned to its core (raises EngineError without vLLM)."""
    process = vllm_process(
        scheduling_policy="fcfs",
        served_model_name=spec.served_model_name,
        max_num_seqs=spec.max_num_seqs,
        max_model_len=spec.max_model_len,
        extra_args=spec.extra_args(),
    )
    process.env["VLLM_SERVER_DEV_MODE"] = "1"  # serves POST /reset_prefix_cache, emptied between runs
    layout.place(process, "vllm", spec.layout())
    return process


class VllmReplicas:
    """Two CPU vLLM servers, one per core, started once per scenario and reused by every run."""

    name = "vllm"

    def __init__(self, specs: Sequence[VllmReplicaSpec]) -> None:
        self.specs = list(specs)
        self.max_num_seqs = self.specs[0].max_num_seqs
        self._processes: list[EngineProcess] = []

    def describe(self) -> str:
        spec = self.specs[0]
        return (
            f"two real vLLM servers (CPU, tiny random-weight Llama), each on one core, max_num_seqs "
            f"{spec.max_num_seqs}, KV cache {spec.kv_blocks} blocks of {spec.block_size} tokens "
            "(`--num-gpu-blocks-override`, prefix caching on)"
        )

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        try:
            for spec in self.specs:
                process = vllm_replica_process(spec)
                await asyncio.to_thread(process.start)
                self._processes.append(process)
                pid = process.pid
                assert pid is not None
                layout.pin_vllm(pid, spec.layout())  # its engine core and worker exist once it is ready
            yield
        finally:
            for process in self._processes:
                await asyncio.to_thread(process.stop)
            self._processes.clear()

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[list[Replica]]:
        replicas = [Replica(p.url, p.served_model_name) for p in self._processes]
        try:
            yield replicas
        finally:
            await asyncio.gather(*(_drain_and_reset(r.url) for r in replicas))


async def _drain_and_reset(url: str, timeout: float = 60.0) -> None:
    """Wait until the engine is idle, then empty its prefix cache (refused while blocks are held: retried)."""
    async with aiohttp.ClientSession() as session:
        await EngineProbe(session, url, RunClock()).wait_idle(timeout)
        for _ in range(20):
            with contextlib.suppress(aiohttp.ClientError, ValueError):
                async with session.post(url + "/reset_prefix_cache") as response:
                    if response.status == 200 and (await response.json()).get("success", True):
                        return
            await asyncio.sleep(0.5)  # blocks still held by requests being freed: no event to wait on
    raise RuntimeError(f"vLLM at {url} did not empty its prefix cache")

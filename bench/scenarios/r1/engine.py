"""R1's engine: one real engine process (vLLM, llama.cpp's server, or the simulator standing in to try the
bench itself) laid out on the machine's cores, and its speed with every slot busy."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import cast

import aiohttp

from bench.clients import DirectClient, RunClock
from bench.product import engine_pool
from bench.records import RequestRecord
from bench.scenarios.r1.setups import SLOTS
from engines import EngineProcess, layout, llamacpp_process, sim_process, vllm_process
from engines.layout import Layout


@dataclass
class RealEngine:
    """One engine process laid out on the machine's cores."""

    kind: str
    url: str
    model: str
    process: EngineProcess
    layout: Layout
    processes: list[dict[str, object]] = field(default_factory=list)

    def cpu_by_role(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for row in self.processes:
            pid = cast(int, row["pid"])
            tid = cast("int | None", row.get("tid"))
            key = str(row["role"])
            out[key] = out.get(key, 0.0) + layout.cpu_seconds(pid, tid)
        return out


@contextlib.asynccontextmanager
async def real_engine(kind: str, lay: Layout) -> AsyncIterator[RealEngine]:
    """Start the engine on the layout's cores; the front end and the compute are pinned once it is ready."""
    if kind == "vllm":
        process = vllm_process(
            scheduling_policy="priority", served_model_name="tiny-llama-priority", max_num_seqs=SLOTS
        )
    elif kind == "llamacpp":
        process = llamacpp_process(slots=SLOTS, threads=1)
    else:  # the simulator, to try the bench itself quickly (its figures mean nothing for the layouts)
        flags = ["--decode-base-ms", "12", "--decode-per-seq-ms", "1"]
        process = sim_process(max_num_seqs=SLOTS, scheduling_policy="priority", extra_args=flags)
    pinned: list[list[dict[str, object]]] = []
    if kind in ("vllm", "sim"):  # as the tests' engines: started on the compute cores, pinned once ready
        layout.lay_out(process, lay, kind, on_pinned=pinned.append)
    else:
        layout.place(process, kind, lay)
    await asyncio.to_thread(process.start)
    engine = RealEngine(kind, process.url, process.served_model_name, process, lay)
    try:
        pid = process.pid
        assert pid is not None
        if kind in ("vllm", "sim"):
            engine.processes = pinned[-1]  # the table as pinned when it was ready
        else:
            async with client_session(kind) as session:
                await direct_once(session, engine, 64)  # warm-up: makes the compute thread the busiest
            engine.processes = layout.pin_llamacpp(pid, lay)
        yield engine
    finally:
        await asyncio.to_thread(process.stop)


def client_session(kind: str) -> aiohttp.ClientSession:
    """The load generator's session towards the engine. llama-server closes the connection after each streamed
    response: no pooled keep-alive there. Elsewhere idle connections close before the engine's keep-alive
    (vLLM: 5 s) does, as the scheduler's adapters do: a direct run lost 9 latecomers to that race ("Server
    disconnected") on a busy machine."""
    return aiohttp.ClientSession(
        connector=engine_pool(force_close=kind == "llamacpp"), timeout=aiohttp.ClientTimeout(total=None)
    )


async def direct_once(session: aiohttp.ClientSession, engine: RealEngine, tokens: int) -> RequestRecord:
    """One request straight to the engine, to its end; raises if it failed."""
    clock = RunClock()
    record = RequestRecord(user="probe", tag="probe", sent=0.0, max_tokens=tokens)
    await DirectClient(session, engine.url, engine.model, clock, "probe").run(record, "How fast is an idle engine?")
    if record.error:
        raise RuntimeError(f"engine probe failed: {record.error}")
    return record


async def calibrate(engine: RealEngine) -> float:
    """Engine output tokens/s with every slot busy (direct): sizes the window the latecomers arrive in. The
    faster of two bursts: the first after start-up ran at 341 tokens/s where the floods then ran at 470-650,
    which put latecomers after the FIFO flood's end (an idle engine answers them at once)."""
    rates = []
    async with client_session(engine.kind) as session:
        for _ in range(2):
            started = time.monotonic()
            records = await asyncio.gather(*(direct_once(session, engine, 128) for _ in range(SLOTS)))
            rates.append(sum(r.tokens for r in records) / (time.monotonic() - started))
    return max(rates)

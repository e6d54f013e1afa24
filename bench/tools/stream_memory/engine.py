"""The engine the memory run holds full: a one-slot simulator whose every step lasts an hour, given
`waiting_target + 1` requests straight over HTTP, so its metrics show the queue at the gate's target."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from bench.clients import RunClock
from bench.harness import simulator, wait_until
from bench.probe import EngineProbe

MODEL = "sim-model"
ENGINE_STEP_MS = 3_600_000.0  # one engine step lasts an hour: the engine's running request never moves on


async def _hold(session: aiohttp.ClientSession, url: str) -> None:
    """One streamed completion straight to the engine, kept open until cancelled."""
    body = {"model": MODEL, "prompt": "hold", "max_tokens": 16, "stream": True, "ignore_eos": True}
    async with session.post(url + "/v1/completions", json=body) as response:
        async for _ in response.content:
            pass


@asynccontextmanager
async def full_engine(waiting_target: int) -> AsyncIterator[str]:
    """A one-slot simulator whose waiting queue shows `waiting_target` requests for as long as this lasts."""
    flags = ("--max-num-seqs", "1", "--decode-base-ms", str(ENGINE_STEP_MS))
    async with simulator(*flags) as url, aiohttp.ClientSession() as session:
        holders = [asyncio.create_task(_hold(session, url)) for _ in range(waiting_target + 1)]
        probe = EngineProbe(session, url, RunClock())

        async def filled() -> bool:
            for task in holders:
                if task.done():
                    task.result()  # raises what went wrong
                    raise RuntimeError("an engine-holding request ended early")
            sample = await probe.read()
            return sample is not None and sample.waiting >= waiting_target and sample.running == 1

        try:
            await wait_until(filled, "engine waiting queue at the target", 30.0)
            yield url
        finally:
            for task in holders:
                task.cancel()
            await asyncio.gather(*holders, return_exceptions=True)

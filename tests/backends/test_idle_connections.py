"""Keep-alive between the adapters and an engine (real sockets on loopback).

vLLM's server closes a connection idle for 5 s; aiohttp's client keeps one for 15 s. On a busy machine a
request then goes out on a connection the engine is closing and fails with "Server disconnected" before
the engine ever saw it: a real bench run on CPU vLLM lost 8 of its 288 scheduled requests that way, and
each put the backend in failover cooldown. The adapter closes idle connections first, and retries once when a
connection breaks before any answer. A TCP relay in front of the simulator plays the engine's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from backends import BackendUnavailable, Finished, GenerationRequest, SamplingParams
from backends.adapters.vllm import VllmBackend
from backends.base import BackendSpec, HttpSettings
from backends.sim import SimConfig, running_simulator

FAST = SimConfig(decode_base_ms=1.0, decode_per_seq_ms=0.2)


@dataclass
class Relay:
    """Forwards TCP connections to `upstream`; the first `drop_first` connections are closed as soon as a
    request arrives on them, unanswered (a connection the engine closed as the request went out)."""

    upstream_port: int
    drop_first: int = 0
    connections: int = 0
    client_closed: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            if self.connections <= self.drop_first:
                await reader.read(1)  # a request began: drop it unanswered
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            back = asyncio.create_task(self._pipe(up_reader, writer))
            await self._pipe(reader, up_writer)  # until the client closes its side
            self.client_closed.set()
            up_writer.close()
            await asyncio.gather(back, return_exceptions=True)
        finally:
            writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()


@contextlib.asynccontextmanager
async def relay_to(upstream_port: int, drop_first: int = 0) -> AsyncIterator[Relay]:
    relay = Relay(upstream_port, drop_first)
    server = await asyncio.start_server(relay.handle, "127.0.0.1", 0)
    relay.port = server.sockets[0].getsockname()[1]
    async with server:
        yield relay


def request(rid: str) -> GenerationRequest:
    return GenerationRequest(
        request_id=rid, prompt="Hello", params=SamplingParams(max_tokens=4, ignore_eos=True, seed=1)
    )


async def finish(backend: VllmBackend, rid: str) -> Finished:
    events = [event async for event in backend.generate(request(rid))]
    assert isinstance(events[-1], Finished)
    return events[-1]


async def test_a_connection_dropped_before_any_answer_is_retried_once_on_another() -> None:
    async with running_simulator(FAST) as sim, relay_to(sim.port, drop_first=1) as relay:
        backend = VllmBackend(BackendSpec(name="b", url=f"http://127.0.0.1:{relay.port}", engine_model="sim-model"))
        try:
            finished = await finish(backend, "r1")
        finally:
            await backend.aclose()
    assert finished.completion_tokens == 4
    assert relay.connections == 2
    assert sim.engine.stats()["completed_total"] == 1  # the dropped connection never reached the engine


async def test_a_second_drop_fails_the_request() -> None:
    async with running_simulator(FAST) as sim, relay_to(sim.port, drop_first=2) as relay:
        backend = VllmBackend(BackendSpec(name="b", url=f"http://127.0.0.1:{relay.port}", engine_model="sim-model"))
        try:
            with pytest.raises(BackendUnavailable, match="cannot reach"):
                await finish(backend, "r1")
        finally:
            await backend.aclose()
    assert relay.connections == 2


async def test_idle_connections_are_closed_by_us_before_the_engine_closes_them() -> None:
    # The engine keeps idle connections for a minute here, so only our side can close this one.
    async with (
        running_simulator(dataclasses.replace(FAST, keep_alive_seconds=60.0)) as sim,
        relay_to(sim.port) as relay,
    ):
        settings = HttpSettings(idle_connection_seconds=0.2)
        backend = VllmBackend(
            BackendSpec(name="b", url=f"http://127.0.0.1:{relay.port}", engine_model="sim-model", http=settings)
        )
        try:
            await finish(backend, "r1")
            await asyncio.wait_for(relay.client_closed.wait(), timeout=10.0)
            await finish(backend, "r2")  # and the next request opens a new one
        finally:
            await backend.aclose()
    assert relay.connections == 2


async def test_the_simulator_closes_idle_connections_like_vllm() -> None:
    async with running_simulator(dataclasses.replace(FAST, keep_alive_seconds=0.2)) as sim:
        reader, writer = await asyncio.open_connection("127.0.0.1", sim.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: sim\r\n\r\n")
        await writer.drain()
        status = await reader.readline()
        # After the answer the server closes the idle connection: the read ends with EOF.
        rest = await asyncio.wait_for(reader.read(), timeout=10.0)
        writer.close()
    assert status.startswith(b"HTTP/1.1 200")
    assert b"Connection: close" not in rest  # kept alive at first, then closed for idleness

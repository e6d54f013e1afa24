"""The blocking client against a live scheduler, where it differs from the asyncio one: `cancel()` comes from
another thread while the consuming thread waits (for the next event, or before a retry). And the raw client's
deadline."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator

import grpc
import pytest

from backends.base import Accepted, BackendLoad, GenerationEvent, GenerationRequest
from backends.errors import BackendUnavailable
from backends.fake import FakeBackend
from clients import Client, Delta, Dispatched, Event, Finished, RetryPolicy
from tests.helpers import ControlledEngine, client_for, make_config, outcome_count, serving, until_settled


async def test_a_stream_cancelled_from_another_thread_stops_the_waiting_consumer_and_the_engine() -> None:
    engine = ControlledEngine()  # after its first token a generation waits for a release that never comes
    async with serving(make_config(), engine.factory()) as server:
        client = await asyncio.to_thread(Client, server.address, user="alice")
        stream = client.stream("m", "a long story")
        first_token = threading.Event()

        def consume() -> list[Event]:
            seen = []
            for event in stream:  # blocks in this worker thread waiting for the next token after the first
                seen.append(event)
                if isinstance(event, Delta):
                    first_token.set()
            return seen

        consumer = asyncio.ensure_future(asyncio.to_thread(consume))
        assert await asyncio.to_thread(first_token.wait, 10.0)
        stream.cancel()  # from the test's own thread
        seen = await asyncio.wait_for(consumer, 10.0)
        await engine.wait_for(lambda: len(engine.aborted) == 1)
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 1)
        await asyncio.to_thread(client.close)
    assert any(isinstance(e, Delta) for e in seen) and not any(isinstance(e, Finished) for e in seen)
    assert engine.finished == []


async def test_a_cancel_while_waiting_to_retry_ends_the_stream_without_the_wait() -> None:
    async def dropped(request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        yield Accepted()  # taken, then dropped before any token: retryable, and the client retries
        raise BackendUnavailable("connection dropped", backend="b0")

    engine = FakeBackend(dropped, lambda: BackendLoad(ok=True, read_at=time.monotonic()), name="b0")
    backend = {"name": "b0", "kind": "vllm", "url": "http://127.0.0.1:1", "scrape_interval_seconds": 0.05}
    model = {"name": "m", "failover_attempts": 0, "failover_cooldown_seconds": 0.0, "backends": [backend]}
    async with serving(make_config(models=[model]), lambda model, backend: engine) as server:
        waiting = threading.Event()
        slow = RetryPolicy(initial_backoff=600.0, max_backoff=600.0)

        client = await asyncio.to_thread(
            Client, server.address, user="alice", retry=slow, on_retry=lambda attempt: waiting.set()
        )
        stream = client.stream("m", "x")
        consumer = asyncio.ensure_future(asyncio.to_thread(list, stream))
        assert await asyncio.to_thread(waiting.wait, 10.0)  # the first attempt failed; the 600 s wait began
        stream.cancel()
        events = await asyncio.wait_for(consumer, 10.0)  # at once, not after the wait
        await asyncio.to_thread(client.close)
    assert any(isinstance(e, Dispatched) for e in events) and not any(isinstance(e, Finished) for e in events)


async def test_the_raw_client_sends_a_deadline_as_the_calls_timeout() -> None:
    async with serving(make_config(), ControlledEngine().factory()) as server:
        raw = client_for(server)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await raw.submit("m", "late", deadline=time.monotonic() - 1.0)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await raw.close()

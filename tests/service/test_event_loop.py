"""The service on the event loop it ships with (`server.event_loop = "uvloop"`), over real gRPC sockets.

The rest of the suite runs in pytest-asyncio's standard loop; `llmsched serve` runs on uvloop by default.
These tests drive the same server in a uvloop loop of their own (`run_on`, what `serve` calls): a stream
completes, a cancelled stream aborts its engine request, and a request queued behind a closed gate is
dispatched when the gate opens (the dispatcher's timers and wake-ups work on libuv's loop too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
import pytest

from scheduler_svc.app.event_loop import run_on
from scheduler_svc.config import ServerConfig
from tests.helpers import ControlledEngine, client_for, make_config, serving
from tests.service import test_rpc
from tests.stream_events import event_or_end, next_event

pytest.importorskip("uvloop")


def _on_uvloop(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    async def checked() -> None:
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        await asyncio.wait_for(body(), 30)

    run_on("uvloop", checked)


def test_the_shipped_default_is_uvloop() -> None:
    assert ServerConfig().event_loop == "uvloop"


def test_a_stream_completes_on_uvloop() -> None:
    async def body() -> None:
        engine = ControlledEngine(tokens=5, auto_release=True)
        async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
            call = client.stream("m", "x", request_id="r1")
            texts = []
            async for event in call:
                if event.WhichOneof("event") == "delta":
                    texts.append(event.delta.text)
            assert "".join(texts) == "hello t1 t2 t3 t4"
            assert await call.code() == grpc.StatusCode.OK
        assert engine.finished == ["r1"]

    _on_uvloop(body)


def test_a_cancelled_stream_aborts_its_engine_request_on_uvloop() -> None:
    _on_uvloop(test_rpc.test_cancel_while_running_aborts_the_engine_request)  # the same test, on libuv's loop


def test_a_request_held_by_the_gate_goes_when_it_opens_on_uvloop() -> None:
    async def body() -> None:
        engine = ControlledEngine(waiting=50, auto_release=True)
        async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
            call = client.stream("m", "x", request_id="held")
            assert (await next_event(call)).WhichOneof("event") == "queued"
            assert engine.started == []
            engine.waiting = 0  # read at the next scrape: the gate opens
            while await event_or_end(call) is not None:
                pass
            assert await call.code() == grpc.StatusCode.OK
        assert engine.finished == ["held"]

    _on_uvloop(body)

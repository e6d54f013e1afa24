"""Every adapter sends a generation's trace context as the W3C `traceparent` and `tracestate` headers of its
engine request (what vLLM reads to continue the trace), and sends none without one: against the simulator's
flavours over real HTTP, the headers recorded as the simulator received them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from backends import ChatMessage, GenerationRequest, SamplingParams, TraceContext, create_backend
from backends.base import BackendSpec
from backends.sim import SimConfig
from backends.sim.app import create_app
from backends.sim.config import Flavor

TRACE = TraceContext("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "congo=t61rcWkgMzE")


@asynccontextmanager
async def recording(flavor: Flavor) -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST":
            seen.append({k: v for k in ("traceparent", "tracestate") if (v := request.headers.get(k))})
        response: web.StreamResponse = await handler(request)
        return response

    app = create_app(SimConfig(flavor=flavor, decode_base_ms=1.0, decode_per_seq_ms=0.0))
    app.middlewares.append(record)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("kind", "flavor", "chat"),
    [
        ("vllm", "vllm", False),
        ("vllm", "vllm", True),
        ("llamacpp", "vllm", False),
        ("tgi", "tgi", False),
        ("tgi", "tgi", True),
    ],
)
async def test_the_engine_request_carries_the_trace_context(kind: str, flavor: Flavor, chat: bool) -> None:
    async with recording(flavor) as (url, seen):
        backend = create_backend(kind, BackendSpec(name="b0", url=url, engine_model="sim-model"))
        try:
            for trace in (TRACE, None):
                request = GenerationRequest(
                    request_id=f"r-{trace is None}",
                    prompt=None if chat else "hello",
                    messages=(ChatMessage("user", "hello"),) if chat else None,
                    params=SamplingParams(max_tokens=2, ignore_eos=True),
                    trace=trace,
                )
                async for _ in backend.generate(request):
                    pass
        finally:
            await backend.aclose()
    assert seen == [{"traceparent": TRACE.traceparent, "tracestate": TRACE.tracestate}, {}]

"""A real vLLM continues the trace: started with `--otlp-traces-endpoint`, it exports its own request span as
a child of the scheduler's dispatch span, in the caller's trace (the `traceparent` the adapter sends)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from clients import pb, pb_grpc
from engines import vllm_process
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.config import TracingConfig
from tests.helpers import make_config, outcome_count, until_settled

pytestmark = pytest.mark.engines

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


@asynccontextmanager
async def otlp_sink() -> AsyncIterator[tuple[str, list[tuple[bytes, bytes, str]], asyncio.Event]]:
    """An OTLP/HTTP traces endpoint keeping (trace id, parent span id, name) of every span it receives."""
    spans: list[tuple[bytes, bytes, str]] = []
    arrived = asyncio.Event()

    async def traces(request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                spans.extend((s.trace_id, s.parent_span_id, s.name) for s in scope.spans)
        arrived.set()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1/traces", spans, arrived
    finally:
        await runner.cleanup()


async def test_vllm_exports_its_request_span_under_the_schedulers_dispatch_span() -> None:
    async with otlp_sink() as (sink_url, engine_spans, arrived):
        engine = vllm_process(served_model_name="tiny-llama-traced", extra_args=["--otlp-traces-endpoint", sink_url])
        engine.env.update({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "100"})
        await asyncio.to_thread(engine.start)
        try:
            config = make_config(backend_url=engine.url, engine_model="tiny-llama-traced")
            config = dataclasses.replace(config, tracing=TracingConfig(endpoint="http://127.0.0.1:4317"))
            exporter = InMemorySpanExporter()
            server = SchedulerServer(config, span_processor=SimpleSpanProcessor(exporter))
            await server.start()
            try:
                async with grpc.aio.insecure_channel(server.address) as channel:
                    params = pb.GenerationParams(model="m", prompt="Once upon a time", max_tokens=4, ignore_eos=True)
                    metadata = (("x-user-id", "alice"), ("traceparent", TRACEPARENT))
                    call = pb_grpc.SchedulerServiceStub(channel).Stream(
                        pb.StreamRequest(params=params), metadata=metadata
                    )
                    events = [event async for event in call]
                await until_settled(server, lambda: outcome_count(server, "completed") == 1)
            finally:
                await server.stop(grace=0.5)
            (dispatch,) = [s for s in exporter.get_finished_spans() if s.name == "dispatch"]
            assert dispatch.context is not None
            under_dispatch = dispatch.context.span_id.to_bytes(8, "big")
            async with asyncio.timeout(30):
                while not any(parent == under_dispatch for _, parent, _ in engine_spans):
                    arrived.clear()
                    await arrived.wait()
        finally:
            await asyncio.to_thread(engine.stop)
    assert events[-1].HasField("finished")
    trace_ids = {trace_id for trace_id, parent, _ in engine_spans if parent == under_dispatch}
    assert trace_ids == {bytes.fromhex(TRACE)}  # the engine's span sits in the caller's trace

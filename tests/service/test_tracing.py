"""Tracing over real sockets: a caller's W3C `traceparent` is continued and reaches the engine as the
scheduler's dispatch span (or unchanged with tracing off), and with `[tracing]` the service's spans, caught
by the OpenTelemetry SDK's in-memory exporter, have the shape operators read: the call, its admission, each
queue wait with the gates that held it, each dispatch with the engine's time to first token and the stream."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypedDict

import aiohttp
import grpc
import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from backends.base import Backend, GenerationEvent, GenerationRequest
from backends.errors import BackendUnavailable
from backends.fake import FakeBackend
from backends.sim import SimConfig
from backends.sim.app import create_app
from clients import AsyncClient, Client, SchedulerClient, pb, pb_grpc
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.app.tracing import OtelTracer
from scheduler_svc.cluster.modes import Role
from scheduler_svc.config import BackendConfig, Config, ModelConfig, TracingConfig
from scheduler_svc.core.clock import FakeClock
from tests.cluster.fake_store import FakeStore, FakeStoreBackend
from tests.cluster.replicas import agent_of, cluster_config, serving, settled
from tests.helpers import ControlledEngine, eventually, make_config, outcome_count, until_settled
from tests.stream_events import event_or_end, next_event

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"
TRACING = TracingConfig(endpoint="http://127.0.0.1:4317")  # never reached: the in-memory exporter takes the spans
STREAM = "llmsched.v1.SchedulerService/Stream"
REPO_ROOT = str(Path(__file__).resolve().parents[2])


def traced(config: Config, tracing: TracingConfig = TRACING) -> Config:
    return dataclasses.replace(config, tracing=tracing)


@asynccontextmanager
async def tracing_server(
    config: Config, factory: Callable[[ModelConfig, BackendConfig], Backend] | None = None
) -> AsyncIterator[tuple[SchedulerServer, InMemorySpanExporter]]:
    """A running scheduler whose spans go to an in-memory exporter."""
    exporter = InMemorySpanExporter()
    kwargs: dict[str, Any] = {"span_processor": SimpleSpanProcessor(exporter)}
    if factory is not None:
        kwargs["backend_factory"] = factory
    server = SchedulerServer(config, **kwargs)
    await server.start()
    try:
        yield server, exporter
    finally:
        await server.stop(grace=0.5)


@asynccontextmanager
async def recording_simulator() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """The vLLM-flavour simulator on a socket, recording the trace headers of every generation it receives."""
    seen: list[dict[str, str]] = []

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            seen.append({name: value for name in ("traceparent", "tracestate") if (value := request.headers.get(name))})
        response: web.StreamResponse = await handler(request)
        return response

    app = create_app(SimConfig(decode_base_ms=1.0, decode_per_seq_ms=0.0))
    app.middlewares.append(record)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()


def stream_call(server: SchedulerServer, *metadata: tuple[str, str], **params: Any) -> Any:
    """A raw Stream call carrying exactly this metadata, and its channel."""
    channel = grpc.aio.insecure_channel(server.address)
    request = pb.StreamRequest(params=pb.GenerationParams(model="m", prompt="hello", **params))
    call = pb_grpc.SchedulerServiceStub(channel).Stream(request, metadata=(("x-user-id", "alice"), *metadata))
    return channel, call


async def stream_all(server: SchedulerServer, *metadata: tuple[str, str], **params: Any) -> list[Any]:
    channel, call = stream_call(server, *metadata, **params)
    async with channel:
        return [event async for event in call]


class TraceContext(TypedDict):
    """The clients' trace-context keyword arguments."""

    traceparent: str
    tracestate: str


def by_name(spans: Sequence[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        named.setdefault(span.name, []).append(span)
    return named


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    context_id: int = span.context.span_id
    return context_id


def engine_traceparent(span: ReadableSpan) -> str:
    """The `traceparent` an engine request under this dispatch span carries."""
    assert span.context is not None
    context = span.context
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


async def test_a_stream_continues_the_callers_trace_into_the_engine() -> None:
    async with recording_simulator() as (url, seen):
        config = traced(make_config(backend_url=url))
        async with tracing_server(config) as (server, exporter):
            events = await stream_all(server, ("traceparent", TRACEPARENT), ("tracestate", "congo=t61rcWkgMzE"))
            await until_settled(server, lambda: outcome_count(server, "completed") == 1)
    assert events[-1].HasField("finished")
    spans = by_name(exporter.get_finished_spans())
    (call,) = spans[STREAM]
    (admission,), (wait,), (dispatch,) = spans["admission"], spans["queue_wait"], spans["dispatch"]
    (ttft,), (stream,) = spans["engine.time_to_first_token"], spans["stream"]
    # one trace, the caller's: the call is a child of the caller's span, a server span
    assert {s.context.trace_id for group in spans.values() for s in group if s.context} == {int(TRACE, 16)}
    assert call.kind is SpanKind.SERVER and call.parent is not None and call.parent.is_remote
    assert parent_of(call) == int(PARENT, 16)
    assert [parent_of(s) for s in (admission, wait, dispatch)] == [span_id(call)] * 3
    assert [parent_of(s) for s in (ttft, stream)] == [span_id(dispatch)] * 2
    assert dispatch.kind is SpanKind.CLIENT and dispatch.attributes is not None
    assert dispatch.attributes["llmsched.backend"] == "b0" and dispatch.attributes["llmsched.attempt"] == 1
    assert call.attributes is not None and call.attributes["llmsched.outcome"] == "completed"
    assert call.attributes["llmsched.model"] == "m" and call.attributes["llmsched.user"] == "alice"
    assert call.attributes["llmsched.completion_tokens"] == 16 and call.status.status_code is not StatusCode.ERROR
    # in order: admitted, waited, sent; the first token ends the engine's time to it, and the stream starts there
    assert wait.end_time is not None and dispatch.start_time is not None and ttft.end_time is not None
    assert ttft.start_time is not None and stream.start_time is not None
    assert wait.end_time <= dispatch.start_time <= ttft.start_time <= ttft.end_time <= stream.start_time
    assert [e.name for e in dispatch.events] == ["engine.accepted"]
    # the engine heard the dispatch span as its parent, and the caller's trace state
    assert seen == [{"traceparent": engine_traceparent(dispatch), "tracestate": "congo=t61rcWkgMzE"}]


async def test_an_http_call_without_a_trace_context_starts_its_own_trace() -> None:
    async with recording_simulator() as (url, seen):
        config = traced(make_config(backend_url=url, server={"http_listen": "127.0.0.1:0"}))
        async with tracing_server(config) as (server, exporter), aiohttp.ClientSession() as session:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            url = f"http://{server.http_address}/v1/chat/completions"
            async with session.post(url, json=body, headers={"x-user-id": "bob"}) as r:
                assert r.status == 200
                text = await r.text()
            await until_settled(server, lambda: outcome_count(server, "completed") == 1)
    assert text.rstrip().endswith("data: [DONE]")
    spans = by_name(exporter.get_finished_spans())
    (call,) = spans["POST /v1/chat/completions"]
    (dispatch,) = spans["dispatch"]
    assert call.parent is None and call.kind is SpanKind.SERVER  # a root: nobody sent a context
    assert [parent_of(s) for s in (*spans["admission"], *spans["queue_wait"], dispatch)] == [span_id(call)] * 3
    assert parent_of(spans["stream"][0]) == span_id(dispatch)
    assert seen == [{"traceparent": engine_traceparent(dispatch)}]


def failing_b0() -> FakeBackend:
    async def generate(request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        raise BackendUnavailable("connection refused", backend="b0")
        yield  # an async generator

    return FakeBackend(generate, name="b0")


def two_backends() -> Config:
    backends = [
        {"name": name, "kind": "vllm", "url": "http://127.0.0.1:1", "scrape_interval_seconds": 0.05}
        for name in ("b0", "b1")
    ]
    config = make_config(models=[{"name": "m", "default_max_tokens": 3, "backends": backends}])
    return traced(config)


async def test_a_failover_shows_two_waits_and_two_dispatches_each_with_its_engine_context() -> None:
    b0, engine = failing_b0(), ControlledEngine(auto_release=True)
    factory = lambda model, backend: b0 if backend.name == "b0" else engine.backend("b1")  # noqa: E731
    async with tracing_server(two_backends(), factory) as (server, exporter):
        events = await stream_all(server, ("traceparent", TRACEPARENT))
        await until_settled(server, lambda: outcome_count(server, "completed") == 1)
    assert events[-1].HasField("finished")
    spans = by_name(exporter.get_finished_spans())
    (call,) = spans[STREAM]
    first, second = spans["dispatch"]
    assert len(spans["queue_wait"]) == 2
    assert [parent_of(s) for s in (*spans["queue_wait"], first, second)] == [span_id(call)] * 4
    assert first.attributes is not None and second.attributes is not None
    assert (first.attributes["llmsched.backend"], first.attributes["llmsched.attempt"]) == ("b0", 1)
    assert (second.attributes["llmsched.backend"], second.attributes["llmsched.attempt"]) == ("b1", 2)
    assert first.attributes["llmsched.failed_over"] is True and first.status.status_code is StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    assert second.status.status_code is not StatusCode.ERROR
    assert parent_of(spans["stream"][0]) == span_id(second)  # the answer came from the second dispatch
    # each attempt told its engine its own dispatch span
    assert [r.trace.traceparent for r in b0.requests if r.trace] == [engine_traceparent(first)]
    assert [r.trace.traceparent for r in engine.requests if r.trace] == [engine_traceparent(second)]


async def test_a_cancelled_stream_ends_its_spans_as_cancelled_with_the_engine_abort() -> None:
    engine = ControlledEngine(tokens=50)
    async with tracing_server(traced(make_config()), engine.factory()) as (server, exporter):
        channel, call = stream_call(server)
        async with channel:
            while not (await next_event(call)).HasField("delta"):
                pass
            call.cancel()
            await until_settled(server, lambda: outcome_count(server, "cancelled") == 1)
    spans = by_name(exporter.get_finished_spans())
    (root,), (dispatch,), (stream,) = spans[STREAM], spans["dispatch"], spans["stream"]
    assert root.attributes is not None and root.attributes["llmsched.outcome"] == "cancelled"
    assert root.status.status_code is StatusCode.ERROR and root.status.description == "cancelled"
    assert [e.name for e in dispatch.events] == ["engine.aborted"]
    assert stream.end_time is not None and stream.end_time <= (root.end_time or 0)
    assert engine.aborted == [engine.started[0]]


async def test_the_queue_wait_names_the_gates_that_held_it() -> None:
    engine = ControlledEngine(waiting=50, auto_release=True)  # the engine's own queue is over the target
    async with tracing_server(traced(make_config()), engine.factory()) as (server, exporter):
        channel, call = stream_call(server)
        async with channel:
            assert (await next_event(call)).HasField("queued")
            # held until the engine's queue drains: the next reading opens the gate
            engine.waiting = 0
            events = []
            while (event := await event_or_end(call)) is not None:
                events.append(event)
        await until_settled(server, lambda: outcome_count(server, "completed") == 1)
    assert events[-1].HasField("finished")
    (wait,) = by_name(exporter.get_finished_spans())["queue_wait"]
    assert wait.attributes is not None
    causes = wait.attributes["llmsched.gate.causes"]
    assert isinstance(causes, tuple | list) and list(causes) == ["engine_waiting"]
    held = [(e.name, dict(e.attributes or {})) for e in wait.events]
    assert held[0] == (
        "gate.closed",
        {"llmsched.backend": "b0", "llmsched.priority_class": "interactive", "llmsched.gate.cause": "engine_waiting"},
    )
    assert held[-1][0] == "gate.opened"
    assert wait.start_time is not None and wait.end_time is not None
    assert all(wait.start_time <= e.timestamp <= wait.end_time for e in wait.events)


@pytest.mark.parametrize(
    "traceparent",
    [f"00-{TRACE.upper()}-{PARENT}-01", f"00-{'0' * 32}-{PARENT}-01", f"ff-{TRACE}-{PARENT}-01", "x" * 4000],
)
async def test_an_invalid_traceparent_is_ignored_and_the_call_goes_on(traceparent: str) -> None:
    engine = ControlledEngine(auto_release=True)
    async with tracing_server(traced(make_config()), engine.factory()) as (server, exporter):
        events = await stream_all(server, ("traceparent", traceparent))
        await until_settled(server, lambda: outcome_count(server, "completed") == 1)
    assert events[-1].HasField("finished")
    (call,) = by_name(exporter.get_finished_spans())[STREAM]
    (dispatch,) = by_name(exporter.get_finished_spans())["dispatch"]
    assert call.parent is None and call.context is not None and call.context.trace_id != int(TRACE, 16)
    assert [r.trace.traceparent for r in engine.requests if r.trace] == [engine_traceparent(dispatch)]


async def test_a_refused_call_is_traced_as_refused() -> None:
    async with tracing_server(traced(make_config()), ControlledEngine().factory()) as (server, exporter):
        channel, call = stream_call(server, ("traceparent", TRACEPARENT), max_tokens=1 << 30)
        async with channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    spans = by_name(exporter.get_finished_spans())
    (call_span,), (admission,) = spans[STREAM], spans["admission"]
    assert set(spans) == {STREAM, "admission"}
    assert call_span.status.status_code is StatusCode.ERROR and admission.status.status_code is StatusCode.ERROR
    assert (call_span.status.description or "").startswith("INVALID_REQUEST: max_tokens")
    assert [e.name for e in admission.events] == ["exception"]


async def test_with_tracing_off_a_valid_traceparent_reaches_the_engine_unchanged() -> None:
    async with recording_simulator() as (url, seen):
        config = make_config(backend_url=url, server={"http_listen": "127.0.0.1:0"})
        async with tracing_server(config) as (server, exporter), aiohttp.ClientSession() as session:
            assert server.tracer is None and server.scheduler.tracer is None
            await stream_all(server, ("traceparent", TRACEPARENT), ("tracestate", "a=1"))
            await stream_all(server, ("traceparent", TRACEPARENT.upper()))  # invalid: nothing goes on
            body = {"model": "m", "prompt": "hi", "max_tokens": 2}
            headers = {"x-user-id": "bob", "traceparent": TRACEPARENT}
            async with session.post(f"http://{server.http_address}/v1/completions", json=body, headers=headers) as r:
                assert r.status == 200
            twice = [("x-user-id", "bob"), ("traceparent", TRACEPARENT), ("traceparent", TRACEPARENT)]
            async with session.post(f"http://{server.http_address}/v1/completions", json=body, headers=twice) as r:
                assert r.status == 200  # sent twice: ignored, never refused
    assert seen == [{"traceparent": TRACEPARENT, "tracestate": "a=1"}, {}, {"traceparent": TRACEPARENT}, {}]
    assert exporter.get_finished_spans() == ()


async def test_the_python_clients_send_a_callers_trace_context_on_every_call() -> None:
    """`traceparent=`/`tracestate=` on the asyncio, blocking and raw clients' calls, and the CLI's flags, reach
    the engine unchanged (tracing off: nothing of the scheduler's own in between)."""
    async with recording_simulator() as (url, seen), tracing_server(make_config(backend_url=url)) as (server, _):
        trace = TraceContext(traceparent=TRACEPARENT, tracestate="a=1")
        async with AsyncClient(server.address, user="alice") as client:
            await client.submit("m", "hi", max_tokens=2, **trace)
            async with client.stream("m", "hi", max_tokens=2, traceparent=TRACEPARENT) as events:
                assert [e async for e in events]
        async with SchedulerClient(server.address, user="bob") as raw:
            await raw.submit("m", "hi", max_tokens=2, **trace)

        def blocking() -> None:
            with Client(server.address, user="carol") as client:
                client.submit("m", "hi", max_tokens=2, **trace)

        await asyncio.to_thread(blocking)
        cli = [sys.executable, "-m", "scheduler_svc.app.cli", "submit", "--target", server.address, "--user", "dan"]
        flags = ["--traceparent", TRACEPARENT, "--tracestate", "a=1", "--max-tokens", "2", "--model", "m", "hi"]
        repo = {**os.environ, "PYTHONPATH": REPO_ROOT}
        done = await asyncio.to_thread(subprocess.run, [*cli, *flags], capture_output=True, env=repo, timeout=60)
        assert done.returncode == 0, done.stderr.decode()
    assert seen == [trace, {"traceparent": TRACEPARENT}, trace, trace, trace]


def test_without_tracing_the_sdk_is_never_loaded() -> None:
    """Off is free: the service is assembled and configured without importing OpenTelemetry at all."""
    code = (
        "import sys\n"
        "from scheduler_svc.app.server import SchedulerServer\n"
        "from tests.helpers import make_config\n"
        "server = SchedulerServer(make_config())\n"
        "assert server.tracer is None and server.scheduler.tracer is None\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_in_a_cluster_the_replica_that_received_the_call_traces_it_alone() -> None:
    """The leader decides for a follower's call and the follower runs its engine request: the follower's spans
    are the whole trace, its dispatch span the engine's parent; the leader's mirror of it makes none."""
    store = FakeStoreBackend()
    exporters = [InMemorySpanExporter(), InMemorySpanExporter()]
    servers: list[SchedulerServer] = []
    async with recording_simulator() as (url, seen):
        try:
            for i, exporter in enumerate(exporters):
                config = traced(cluster_config(url, f"r{i}"))
                server = SchedulerServer(
                    config,
                    store_factory=serving(FakeStore(store)),
                    span_processor=SimpleSpanProcessor(exporter),
                )
                await server.start()
                servers.append(server)
                if i == 0:
                    await eventually(lambda: agent_of(servers[0]).role is Role.LEADING, 5.0, "r0 leading")
            assert await settled(servers) is servers[0]
            follower = servers[1]
            events = await stream_all(follower, ("traceparent", TRACEPARENT))
            await until_settled(follower, lambda: outcome_count(follower, "completed") == 1)
        finally:
            for server in servers:
                await server.stop(grace=0.5)
    assert events[-1].HasField("finished")
    spans = by_name(exporters[1].get_finished_spans())
    (call,), (dispatch,) = spans[STREAM], spans["dispatch"]
    assert parent_of(call) == int(PARENT, 16) and parent_of(dispatch) == span_id(call)
    assert seen == [{"traceparent": engine_traceparent(dispatch)}]
    assert exporters[0].get_finished_spans() == ()


def test_a_failing_trace_step_is_logged_and_never_raises() -> None:
    """Dispatch calls the trace in the middle of its own accounting: a broken step must not break it."""

    class BrokenLog:
        def mark(self) -> int:
            return 0

        def closed(self) -> list[Any]:
            return []

        def since(self, mark: int) -> Any:
            raise RuntimeError("broken")

    exporter = InMemorySpanExporter()
    tracer = OtelTracer(TRACING, FakeClock(), SimpleSpanProcessor(exporter))
    trace = tracer.start(None, "call")
    trace.queued(0.0, BrokenLog())
    trace.dispatched(1.0, "b0", 1, None, BrokenLog())  # logged, not raised
    trace.ended(2.0, "completed", 0)
    assert {s.name for s in exporter.get_finished_spans()} >= {"call", "admission"}
    tracer.close()

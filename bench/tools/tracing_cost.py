"""The scheduler's cost per request with tracing off, off with a caller's `traceparent` passed on, and on,
side by side; with `--baseline REF`, also the scheduler as it was at a git ref (before tracing existed).

Why: tracing must be free when off (no span objects, no per-request allocations beyond a None check) and
cheap enough when on. Two measures, each setup side by side:

- CPU: the whole scheduler process's CPU time (user + system from /proc) while `--requests` gRPC Stream
  calls (`--concurrency` at a time, 16 tokens each) go through it to an engine that answers at once
  (`bench.fake_engine`), divided by the requests. Each round starts one scheduler per setup, in an order
  that alternates between rounds; the report gives each setup's median and range over the rounds and the
  ratios of the medians. With tracing on, spans go over OTLP/HTTP to a sink in this process, and the count
  waits until every span has arrived (the SDK exports on its own thread, in the scheduler's process).
- Python calls: the calls of the service's own functions (and resumptions of its generators) per request
  (`scheduler_svc`, `backends`), counted with `sys.setprofile` around `--call-requests` sequential Stream
  calls, the scheduler, a fake engine and the client in one process. No timer fires meanwhile, so the
  count hardly depends on the machine: off against before shows what tracing adds to a request's path when
  it is off. (With tracing on, the calls into the SDK are not the service's own and its export thread is
  not counted here; the CPU measure has them.)

    .venv/bin/python -m bench.tools.tracing_cost                          # 3 rounds, 2000 requests, 16 at a time
    .venv/bin/python -m bench.tools.tracing_cost --baseline 2b15ba9       # and the scheduler at that commit
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import grpc
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench import harness
from bench.configs import scheduler_config, validated_toml
from clients import pb, pb_grpc

CALLS_CHILD = """
import asyncio, json, os, sys, time
import grpc
from backends.base import BackendLoad, Finished, TextDelta
from backends.fake import FakeBackend
from clients import pb, pb_grpc
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.app.settings import config_from_dict

REQUESTS, TRACING, TRACEPARENT = int(sys.argv[1]), sys.argv[2], sys.argv[3]

async def generate(request):
    for _ in range(16):
        yield TextDelta(" t")
    yield Finished("length", prompt_tokens=4, completion_tokens=16)

def load():
    return BackendLoad(ok=True, read_at=time.monotonic())

raw = {
    "server": {"listen": "127.0.0.1:0", "metrics_listen": "", "log_level": "warning",
               "unhealthy_after_stalled_seconds": 0, "stream_read_interval_seconds": 0},
    "models": [{"name": "m", "backends": [{"name": "b0", "kind": "vllm", "url": "http://127.0.0.1:1",
                                          "scrape_interval_seconds": 3600}]}],
}
if TRACING:
    raw["tracing"] = {"endpoint": TRACING, "protocol": "http/protobuf"}

async def main():
    engine = lambda model, backend: FakeBackend(generate, load, name=backend.name)
    server = SchedulerServer(config_from_dict(raw), backend_factory=engine)
    await server.start()
    metadata = (("x-user-id", "alice"),) + ((("traceparent", TRACEPARENT),) if TRACEPARENT else ())
    request = pb.StreamRequest(params=pb.GenerationParams(model="m", prompt="hello world", max_tokens=16))
    calls = 0
    ours = tuple(os.path.join(os.getcwd(), package) + os.sep for package in ("scheduler_svc", "backends"))
    def count(frame, event, arg):
        nonlocal calls
        if event == "call" and frame.f_code.co_filename.startswith(ours):
            calls += 1
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)
        async def one():
            async for _ in stub.Stream(request, metadata=metadata):
                pass
        for _ in range(50):
            await one()
        sys.setprofile(count)
        for _ in range(REQUESTS):
            await one()
        sys.setprofile(None)
    await server.stop(grace=0.5)
    print(json.dumps({"calls_per_request": calls / REQUESTS}))

asyncio.run(main())
"""

MODEL = "m"
TOKENS = 16
SPANS_PER_REQUEST = 6  # the call, admission, queue_wait, dispatch, engine.time_to_first_token, stream
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@dataclass
class Setup:
    """One way to run the scheduler: its code (`root`), its `[tracing]`, whether callers send a traceparent."""

    name: str
    root: Path = harness.ROOT
    tracing: bool = False
    traceparent: bool = False
    sampling_ratio: float = 1.0


@dataclass
class SpanSink:
    """An OTLP/HTTP traces endpoint that counts the spans it receives."""

    spans: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def traces(self, request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        self.spans += sum(len(scope.spans) for resource in export.resource_spans for scope in resource.scope_spans)
        self.arrived.set()
        return web.Response(body=b"", content_type="application/x-protobuf")  # an empty ExportTraceServiceResponse

    async def wait_for(self, spans: int, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while self.spans < spans:
                self.arrived.clear()
                await self.arrived.wait()


@asynccontextmanager
async def span_sink() -> AsyncIterator[tuple[SpanSink, str]]:
    sink = SpanSink()
    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/traces", sink.traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield sink, f"http://127.0.0.1:{runner.addresses[0][1]}/v1/traces"
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def tree_at(ref: str) -> Any:
    """This repository's files at `ref`, in a temporary folder (nothing in the checkout changes)."""
    with tempfile.TemporaryDirectory(prefix="llmsched-baseline-") as folder:
        archive = subprocess.run(["git", "archive", ref], cwd=harness.ROOT, check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(folder, filter="data")
        yield Path(folder)


async def _stream(stub: pb_grpc.SchedulerServiceStub, user: str, traceparent: bool) -> int:
    params = pb.GenerationParams(model=MODEL, prompt="hello world", max_tokens=TOKENS)
    metadata: tuple[tuple[str, str], ...] = (("x-user-id", user),)
    if traceparent:
        metadata += (("traceparent", TRACEPARENT),)
    call = cast(
        "grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]",
        stub.Stream(pb.StreamRequest(params=params), metadata=metadata),
    )
    tokens = 0
    async for event in call:
        if event.HasField("delta"):
            tokens += event.delta.tokens
    return tokens


async def _requests(stub: pb_grpc.SchedulerServiceStub, count: int, concurrency: int, traceparent: bool) -> int:
    """`count` streams, `concurrency` at a time, from 8 users; the tokens they carried."""
    queue = iter(range(count))
    carried = 0

    async def worker() -> None:
        nonlocal carried
        for i in queue:
            tokens = await _stream(stub, f"u{i % 8}", traceparent)  # read `carried` only after the await
            carried += tokens

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return carried


async def cpu_per_request(
    setup: Setup, engine_url: str, sink: SpanSink, sink_url: str, requests: int, concurrency: int
) -> tuple[float, float]:
    """Microseconds of the scheduler's CPU per request under `setup`, and the seconds the requests took."""
    config = scheduler_config(engine_url=engine_url, model=MODEL, engine_model="fake-model")
    if setup.tracing:
        config["tracing"] = {"endpoint": sink_url, "protocol": "http/protobuf", "sampling_ratio": setup.sampling_ratio}
    sampled = setup.tracing and setup.sampling_ratio > 0
    warmup, spans = 64, sink.spans
    async with (
        harness.scheduler_process(validated_toml(config), root=setup.root) as scheduler,
        grpc.aio.insecure_channel(scheduler.target) as channel,
    ):
        stub = pb_grpc.SchedulerServiceStub(channel)
        await _requests(stub, warmup, concurrency, setup.traceparent)  # first-use costs
        if sampled:
            await sink.wait_for(spans + warmup * SPANS_PER_REQUEST, 30.0)
        cpu, start = scheduler.cpu_seconds(), time.monotonic()
        carried = await _requests(stub, requests, concurrency, setup.traceparent)
        wall = time.monotonic() - start
        if sampled:  # every span exported, the export's CPU spent
            await sink.wait_for(spans + (warmup + requests) * SPANS_PER_REQUEST, 30.0)
        cpu = scheduler.cpu_seconds() - cpu
    if carried != requests * TOKENS:
        raise RuntimeError(f"{setup.name}: {carried} tokens streamed, expected {requests * TOKENS}")
    return 1e6 * cpu / requests, wall


async def calls_per_request(setup: Setup, sink_url: str, requests: int) -> float:
    """Python calls per request on the event loop's thread under `setup` (see the module docstring)."""
    argv = [sys.executable, "-c", CALLS_CHILD, str(requests)]
    argv += [sink_url if setup.tracing else "", TRACEPARENT if setup.traceparent else ""]
    proc = harness.spawn(argv, f"calls-{time.monotonic_ns()}", setup.root)
    code = await asyncio.to_thread(proc.popen.wait, 300)
    output = proc.log_path.read_text()
    if code != 0:
        raise RuntimeError(f"{setup.name}: the call count failed; see {proc.log_path}")
    return float(json.loads(output.strip().splitlines()[-1])["calls_per_request"])


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--call-requests", type=int, default=500, help="requests of the call count (0: none)")
    parser.add_argument("--baseline", default="", help="also run the scheduler at this git ref (before tracing)")
    args = parser.parse_args(argv)
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"  # the scheduler's SDK exports every 0.1 s: the count waits less
    with contextlib.ExitStack() as stack:
        setups = []
        if args.baseline:
            setups.append(Setup(f"before ({args.baseline})", root=stack.enter_context(tree_at(args.baseline))))
        setups += [
            Setup("off"),
            Setup("off, traceparent sent", traceparent=True),
            Setup("on (sampled)", tracing=True, traceparent=True),
            Setup("on (not sampled)", tracing=True, sampling_ratio=0.0),
        ]
        results: dict[str, list[float]] = {s.name: [] for s in setups}
        async with harness.fake_engine(TOKENS) as engine_url, span_sink() as (sink, sink_url):
            for round_no in range(args.rounds):
                order = setups if round_no % 2 == 0 else list(reversed(setups))
                for setup in order:
                    us, wall = await cpu_per_request(setup, engine_url, sink, sink_url, args.requests, args.concurrency)
                    results[setup.name].append(us)
                    print(
                        f"round {round_no + 1} {setup.name:24s}: {us:6.0f} us of scheduler CPU per request "
                        f"({args.requests} requests in {wall:.1f} s)",
                        flush=True,
                    )
            calls: dict[str, float] = {}
            if args.call_requests:
                for setup in setups:
                    calls[setup.name] = await calls_per_request(setup, sink_url, args.call_requests)
                    print(f"{setup.name:24s}: {calls[setup.name]:.1f} Python calls per request", flush=True)
    medians = {name: statistics.median(values) for name, values in results.items() if values}
    for name, median in medians.items():
        values = results[name]
        print(f"{name:24s}: median {median:.0f} us/request (range {min(values):.0f}-{max(values):.0f})")
    for name, median in medians.items():
        if name != "off":
            print(f"{name} / off: {median / medians['off']:.3f}x the CPU per request")
    for name, count in calls.items():
        if name != "off":
            print(f"{name} - off: {count - calls['off']:+.1f} Python calls per request")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))

"""R1's samplers, running beside each run: the engine's own metrics (waiting, running, tokens, steps) every
0.1 s, and for a scheduler run its gate's decisions through GetQueueState every 0.2 s."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import grpc

from bench.clients import RunClock
from bench.configs import SCHEDULED_MODEL
from bench.product import MetricSamples, MetricsReader, MetricsStatus
from bench.scenarios.r1.engine import RealEngine
from clients import pb, pb_grpc

SAMPLE_INTERVAL = 0.1  # the bench's own engine sampler: the sampling period of its time series

# waiting, running, generated tokens, engine steps (vLLM: its per-step token histogram's count; llama.cpp:
# its llama_decode() calls; the simulator exports no step series, so its step figures read "-")
_VLLM_METRIC_NAMES = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:generation_tokens_total",
    "vllm:iteration_tokens_total_count",
)
METRIC_NAMES = {
    "sim": _VLLM_METRIC_NAMES,
    "vllm": _VLLM_METRIC_NAMES,
    "llamacpp": (
        "llamacpp:requests_deferred",
        "llamacpp:requests_processing",
        "llamacpp:tokens_predicted_total",
        "llamacpp:n_decode_total",
    ),
}


@dataclass
class Sample:
    t: float
    waiting: float
    running: float
    generated: float
    steps: float | None = None  # the engine's step counter (None where it exports none)


async def engine_sampler(
    session: aiohttp.ClientSession, engine: RealEngine, clock: RunClock, out: list[Sample]
) -> None:
    names = METRIC_NAMES[engine.kind]
    waiting_name, running_name, generated_name, steps_name = names
    # vLLM (and the simulator) select these series themselves at /metrics/ (Prometheus `name[]`, through the
    # adapters' own reader): writing all 50 KB costs its front end 10-13 ms of CPU, every 0.1 s, on the core
    # the front end and the scheduler share in the GPU-host layout. Parsing only those likewise.
    reader = MetricsReader(engine.url + "/metrics", select_on_server=engine.kind in ("vllm", "sim"))

    def sample(samples: MetricSamples) -> Sample:
        return Sample(
            clock.now(),
            samples.total(waiting_name) or 0.0,
            samples.total(running_name) or 0.0,
            samples.total(generated_name) or 0.0,
            samples.total(steps_name),
        )

    while True:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, MetricsStatus):
            out.append(await reader.read(session, names, sample, aiohttp.ClientTimeout(total=5)))
        await asyncio.sleep(SAMPLE_INTERVAL)


async def gate_sampler(stub: pb_grpc.SchedulerServiceStub, clock: RunClock, out: list[dict[str, Any]]) -> None:
    while True:
        with contextlib.suppress(grpc.aio.AioRpcError):
            call = cast(
                "grpc.aio.UnaryUnaryCall[pb.GetQueueStateRequest, pb.GetQueueStateResponse]",
                stub.GetQueueState(pb.GetQueueStateRequest(model=SCHEDULED_MODEL), metadata=(("x-user-id", "bench"),)),
            )
            state = await call
            for model in state.models:
                for gate in model.gates:
                    out.append(
                        {
                            "t": clock.now(),
                            "queued": model.queued,
                            "running": model.running,
                            "open": gate.open,
                            "reason": gate.reason,
                            "fresh": gate.metrics_fresh,
                            "age": gate.reading_age.ToNanoseconds() / 1e9 if gate.HasField("reading_age") else -1.0,
                            "engine_waiting": gate.engine_waiting,
                            "engine_running": gate.engine_running,
                            "in_flight": gate.in_flight,
                            "sent_unseen": gate.sent_unseen,
                            "estimated_waiting": gate.estimated_waiting,
                        }
                    )
        await asyncio.sleep(0.2)  # sampling period

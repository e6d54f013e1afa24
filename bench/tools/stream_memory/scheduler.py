"""The scheduler of the memory run: caps that admit every call spread over the users, the gate held on the
engine's last reading, what it reports (queue state, its counters), and its process's resident memory."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc

from bench.configs import validated_toml
from bench.harness import wait_until
from bench.product import MetricSamples
from bench.tools.stream_memory.engine import MODEL
from clients import pb, pb_grpc


@dataclass(frozen=True)
class Memory:
    """Resident memory of a process, in bytes."""

    rss: int
    peak: int

    @classmethod
    def of(cls, pid: int | str) -> Memory:
        """VmRSS and VmHWM from /proc/<pid>/status."""
        fields: dict[str, int] = {}
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
        return cls(rss=fields["VmRSS"], peak=fields["VmHWM"])


def mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


def scheduler_toml(
    engine_url: str,
    metrics_port: int,
    *,
    capacity: int,
    users: int,
    waiting_target: int,
    update_interval: float,
    prompt_bytes: int = 0,
) -> str:
    """One model on the engine, caps that admit `capacity` requests spread evenly over `users` users."""
    config: dict[str, Any] = {
        "server": {
            "listen": "127.0.0.1:{GRPC_PORT}",
            "metrics_listen": f"127.0.0.1:{metrics_port}",
            "log_level": "warning",
            "shutdown_grace_seconds": 1.0,
            "queue_update_interval_seconds": update_interval,
        },
        "scheduling": {"fairness": "round_robin"},
        "models": [
            {
                "name": MODEL,
                "max_queued": capacity,
                "max_queued_per_user": math.ceil(capacity / users),
                "max_prompt_bytes": max(prompt_bytes, 1 << 20),
                "max_queued_bytes": max(capacity * prompt_bytes, 1 << 28),
                "max_queued_bytes_per_user": max(math.ceil(capacity / users) * prompt_bytes, 1 << 25),
                "gate": {"waiting_target": waiting_target, "stale_after_seconds": 3600.0},
                "backends": [{"name": "sim-0", "kind": "vllm", "url": engine_url, "scrape_interval_seconds": 0.2}],
            }
        ],
    }
    return validated_toml(config)


async def model_state(stub: pb_grpc.SchedulerServiceStub) -> pb.ModelQueueState:
    response = await cast(
        "grpc.aio.UnaryUnaryCall[pb.GetQueueStateRequest, pb.GetQueueStateResponse]",
        stub.GetQueueState(pb.GetQueueStateRequest(model=MODEL), metadata=(("x-user-id", "bench"),)),
    )
    return response.models[0]


def scheduler_counters(metrics_text: str) -> dict[str, float]:
    """Dispatched and outcome counters from the scheduler's own /metrics."""
    samples = MetricSamples.parse(metrics_text)
    counters = {"dispatched": samples.total("llmsched_requests_dispatched_total") or 0.0}
    for outcome in ("cancelled", "completed", "failed", "expired"):
        counters[outcome] = samples.total("llmsched_request_outcomes_total", outcome=outcome) or 0.0
    return counters


async def wait_queued(stub: pb_grpc.SchedulerServiceStub, count: int, timeout: float) -> float:
    async def reached() -> bool:
        state = await model_state(stub)
        if state.running:
            raise RuntimeError(f"the scheduler dispatched {state.running} request(s): the gate was not closed")
        return state.queued == count

    return await wait_until(reached, f"{count} queued in the scheduler", timeout)

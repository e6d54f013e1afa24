"""S7's processes and faults: the simulator with its journal (SIGKILLed and restarted on its port, its metrics
taken down for a while) and the scheduler with caps on and its metrics endpoint open."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp

from bench import harness
from bench.configs import SCHEDULED_MODEL, STANDARD_CLASS, Toml, validated_toml
from bench.product import SERVICE_COMMAND
from bench.scenarios.s7.calls import Load
from bench.scenarios.s7.params import KILL_CANCEL_MARGIN, S7Params
from engines import free_port


def scheduler_toml(p: S7Params, engine_url: str, metrics_port: int) -> str:
    """The scenario's config as TOML: caps on, one simulated engine."""
    model: Toml = {
        "name": SCHEDULED_MODEL,
        "max_tokens_limit": 4096,
        "max_queued": p.max_queued,
        "max_queued_per_user": p.max_queued_per_user,
        "max_prompt_bytes": p.max_prompt_bytes,
        "max_queued_bytes": p.max_queued_bytes,
        "max_queued_bytes_per_user": p.max_queued_bytes_per_user,
        "failover_attempts": 1,
        "gate": {"waiting_target": 3},
        "backends": [
            {
                "name": "engine-0",
                "kind": "vllm",
                "url": engine_url,
                "engine_model": "sim-model",
                "scrape_interval_seconds": 0.1,
                "max_num_seqs": p.max_num_seqs,
            }
        ],
    }
    config: Toml = {
        "server": {
            "listen": "127.0.0.1:{GRPC_PORT}",
            "metrics_listen": f"127.0.0.1:{metrics_port}",
            "log_level": "warning",
            "shutdown_grace_seconds": 1.0,
        },
        "scheduling": {"fairness": "round_robin", "classes": STANDARD_CLASS, "default_class": "standard"},
        "models": [model],
    }
    return validated_toml(config)


class Stack:
    """The simulator (with its journal, killable and restartable on its port) and the scheduler."""

    def __init__(self, p: S7Params, workdir: Path) -> None:
        self.p = p
        self.journal = workdir / "s7-journal.jsonl"
        self.journal.unlink(missing_ok=True)
        self.sim_port = free_port()
        self.sim_url = f"http://127.0.0.1:{self.sim_port}"
        self.metrics_port = free_port()
        self.sim: harness.Proc | None = None
        self.sim_starts = 0

    async def start_sim(self) -> None:
        self.sim_starts += 1
        args = [
            *SERVICE_COMMAND, "sim", "--port", str(self.sim_port),
            "--journal", str(self.journal), *self.p.profile().flags("fcfs"),
        ]  # fmt: skip
        self.sim = harness.spawn(args, f"s7-sim-{self.sim_port}-{self.sim_starts}")
        await harness.wait_http(self.sim_url + "/health", self.sim)

    def kill_sim(self) -> None:
        assert self.sim is not None
        self.sim.popen.send_signal(signal.SIGKILL)
        self.sim.popen.wait()

    def stop(self) -> None:
        if self.sim is not None:
            self.sim.stop()


async def faults(
    stack: Stack, session: aiohttp.ClientSession, load: Load, p: S7Params, t0: float, log: list[str]
) -> None:
    """SIGKILL and restart the engine, then take its metrics endpoint down for a while."""
    await asyncio.sleep(max(0.0, t0 + p.kill_at - KILL_CANCEL_MARGIN - time.monotonic()))
    load.cancel_paused = True
    await asyncio.sleep(KILL_CANCEL_MARGIN)
    stack.kill_sim()
    log.append(f"{time.monotonic() - t0:.1f}s engine SIGKILLed (no client cancels from 1 s before to 3 s after)")
    await asyncio.sleep(p.restart_after)  # an engine that takes a moment to come back
    await stack.start_sim()
    log.append(f"{time.monotonic() - t0:.1f}s engine restarted on the same port")
    await asyncio.sleep(3 * KILL_CANCEL_MARGIN)  # the loaded client reads the kill's errors a moment later
    load.cancel_paused = False
    await asyncio.sleep(max(0.0, t0 + p.metrics_down_at - time.monotonic()))
    async with session.post(stack.sim_url + "/sim/faults", json={"metrics_down": True}) as response:
        response.raise_for_status()
    log.append(f"{time.monotonic() - t0:.1f}s engine metrics down")
    await asyncio.sleep(p.metrics_down_for)  # the outage itself
    async with session.post(stack.sim_url + "/sim/faults", json={"metrics_down": False}) as response:
        response.raise_for_status()
    log.append(f"{time.monotonic() - t0:.1f}s engine metrics back")

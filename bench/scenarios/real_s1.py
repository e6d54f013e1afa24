"""R1: S1 and S2 on a real engine (vLLM or llama.cpp), laid out like a GPU host, with many latecomers.

Workload: user A floods 64 streamed requests of exactly 256 tokens (`ignore_eos`; the mixed
workload: 32-512 tokens); B and C send one each at +1 s and +2 s, and 30 more latecomers (distinct users,
16 tokens) at random offsets through the flood. Setups are interleaved in every round, on one engine:

- scheduler, engine priorities on (vLLM started with `--scheduling-policy priority`);
- the oracle: vLLM's own priority queue, latecomers send `priority: -1` straight to the engine;
- the engine's FIFO, straight: the same priority-policy engine with every request at priority 0 is FCFS
  (its queue orders by (priority, arrival)), so one engine serves every setup of a round;
- scheduler, engine priorities off (pure gating: the TGI path; the only scheduler setup for llama.cpp);
- optionally the scheduler from another source tree (`--baseline-src`: another version to compare with);
- on request only (`--setups ...,sched_asyncio`): the scheduler on asyncio's own event loop instead of the
  shipped uvloop, engine priorities on (what the loop's CPU per token costs on a real engine); likewise
  `sched_every_token` and `sched_paced`: the scheduler reading every token as it arrives
  (`server.stream_read_interval_seconds = 0`), or with tokens grouped within 50 ms (0.05, the shipped
  default, which the other scheduler setups run with in every layout);
- on request too, a user's first config as written, with none of the bench's settings: `first_minimal` (only
  the model and a priority vLLM backend), `first_minimal_slots` (and its max_num_seqs) and `first_example`
  (configs/example.toml as shipped, pointed at the engine); `first_minimal_base` runs the minimal config on
  the scheduler from `--baseline-src`, so two versions' defaults meet in the same rounds.

Reported per setup: latecomer TTFT median and p90 (pooled over the rounds, per-round medians for the
spread), ratios against the oracle of the same rounds, the flood's span (first send to last token) against
FIFO's in the same round, engine output tokens/s over the whole flood and in its middle half, the share of
engine-metric samples with every slot busy while requests wait for their first token, the flood's span split
into the engine's own step count and its time per step (each against FIFO's), and for scheduler
runs the gate's decisions sampled through GetQueueState (where the slots go empty, and why).

    python -m bench.scenarios.real_s1 --engine vllm --layouts gpu_host --workload flood --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import dataclasses
import itertools
import json
import os
import random
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp
import grpc

from backends.base import HttpSettings
from backends.http import engine_connector
from backends.metrics import MetricSamples
from backends.metrics_reader import MetricsReader, MetricsStatus
from bench import harness
from bench.clients import Client, DirectClient, RunClock, ScheduledClient
from bench.configs import example_config, minimal_config, scheduler_config, validated_toml
from bench.records import RequestRecord
from bench.results import ScenarioResult, Table, Target
from bench.runner import SCHEDULED_MODEL
from bench.scenarios._common import STANDARD_CLASS, jsonable, seconds
from bench.scenarios.definition import Definition
from clients import pb, pb_grpc
from engines import EngineProcess, layout, llamacpp_process, sim_process, vllm_process
from engines.layout import Layout
from scheduler_svc.config import BackendConfig

ROOT = Path(__file__).resolve().parents[2]
SLOTS = 4
GATE_TARGET = 3
PRIORITY_GATE_TARGET = 6  # the queue a latecomer jumps at a priority engine: what the gate derives at 4 slots
SAMPLE_INTERVAL = 0.1  # the bench's own engine sampler: the sampling period of its time series
# the scheduler setups read the engine's metrics as the shipped config does (BackendConfig's default, as
# configs/example.toml sets it); `sched_scrape_01` reads every 0.1 s instead (no difference measured on the
# GPU host)
SHIPPED_SCRAPE_INTERVAL = BackendConfig.scrape_interval_seconds

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


@dataclass(frozen=True)
class Workload:
    name: str
    flood: int = 64
    tokens_min: int = 256
    tokens_max: int = 256
    latecomers: int = 30  # besides B and C
    latecomer_tokens: int = 16

    def describe(self) -> str:
        lengths = (
            f"exactly {self.tokens_min}"
            if self.tokens_min == self.tokens_max
            else f"{self.tokens_min}-{self.tokens_max}"
        )
        return (
            f"user A floods {self.flood} streamed requests of {lengths} tokens (ignore_eos); B and C send one "
            f"each at +1 s and +2 s, {self.latecomers} more latecomers (distinct users, {self.latecomer_tokens} "
            "tokens) at random offsets through the flood"
        )


WORKLOADS = {"flood": Workload("flood"), "mixed": Workload("mixed", tokens_min=32, tokens_max=512)}


@dataclass(frozen=True)
class Setup:
    key: str
    label: str
    scheduled: bool
    engine_priorities: bool = False
    latecomer_priority: int | None = None
    baseline: bool = False
    event_loop: str = "uvloop"  # the scheduler's server.event_loop
    read_interval: float | None = None  # its server.stream_read_interval_seconds (None: the shipped default)
    group_at_engine: bool | None = None  # its server.stream_group_at_engine (None: the shipped default)
    waiting_target: int = GATE_TARGET  # the gate's waiting target (at an engine without priorities, all it has)
    adapt_seconds: float | None = None  # its gate.waiting_target_adapt_seconds (None: the shipped default)
    scrape_interval: float = SHIPPED_SCRAPE_INTERVAL  # how often the scheduler reads the engine's metrics
    first_config: str = ""  # a user's first config instead of the bench's: minimal, minimal_slots, example


SCHED = Setup("sched", "scheduler, engine priorities on", True, engine_priorities=True)
ORACLE = Setup("oracle", "vLLM priority queue, latecomers -1 (oracle)", False, latecomer_priority=-1)
FIFO = Setup("fifo", "engine FIFO, direct", False)
SCHED_OFF = Setup("sched_off", "scheduler, engine priorities off (pure gating)", True)
SCHED_BASE = Setup("sched_base", "scheduler from --baseline-src, engine priorities on", True, True, baseline=True)
SCHED_ASYNCIO = Setup(
    "sched_asyncio", "scheduler on asyncio's loop, engine priorities on", True, True, event_loop="asyncio"
)
SCHED_EVERY_TOKEN = Setup(
    "sched_every_token", "scheduler reading every token as it arrives, priorities on", True, True, read_interval=0.0
)
SCHED_PACED = Setup(
    "sched_paced", "scheduler with tokens grouped within 50 ms, priorities on", True, True, read_interval=0.05
)
SCHED_READ_PACED = Setup(
    "sched_read_paced",
    "scheduler reading at most every 50 ms, engine sends every token, priorities on",
    True,
    True,
    read_interval=0.05,
    group_at_engine=False,
)
SCHED_OFF_TARGET_1 = Setup(
    "sched_off_target_1", "scheduler, engine priorities off, waiting target 1", True, waiting_target=1
)
SCHED_OFF_FIXED = Setup(
    "sched_off_fixed", "scheduler, engine priorities off, waiting target held at 3", True, adapt_seconds=0.0
)
SCHED_SCRAPE_01 = Setup(
    "sched_scrape_01",
    "scheduler reading the engine's metrics every 0.1 s, priorities on",
    True,
    True,
    scrape_interval=0.1,
)
# A user's first config against a priority vLLM, each as written, with none of the bench's own settings
FIRST_MINIMAL = Setup(
    "first_minimal", "minimal config (model + priority vLLM backend)", True, True, first_config="minimal"
)
FIRST_MINIMAL_SLOTS = Setup(
    "first_minimal_slots", "minimal config + max_num_seqs = 4", True, True, first_config="minimal_slots"
)
FIRST_EXAMPLE = Setup("first_example", "configs/example.toml", True, True, first_config="example")
FIRST_MINIMAL_BASE = Setup(
    "first_minimal_base",
    "minimal config, scheduler from --baseline-src",
    True,
    True,
    baseline=True,
    first_config="minimal",
)
# run only when --setups names them
ON_REQUEST = (
    FIRST_MINIMAL,
    FIRST_MINIMAL_SLOTS,
    FIRST_EXAMPLE,
    FIRST_MINIMAL_BASE,
    SCHED_SCRAPE_01,
    SCHED_ASYNCIO,
    SCHED_EVERY_TOKEN,
    SCHED_PACED,
    SCHED_READ_PACED,
    SCHED_OFF_TARGET_1,
    SCHED_OFF_FIXED,
)


def setups_for(engine: str, baseline: bool) -> list[Setup]:
    if engine == "llamacpp":
        return [SCHED_OFF, FIFO]
    return [SCHED, ORACLE, FIFO, SCHED_OFF, *([SCHED_BASE] if baseline else [])]


# ------------------------------------------------------------------------------------------------ engines


@dataclass
class RealEngine:
    """One engine process laid out on the machine's cores."""

    kind: str
    url: str
    model: str
    process: EngineProcess
    layout: Layout
    processes: list[dict[str, object]] = field(default_factory=list)

    def cpu_by_role(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for row in self.processes:
            pid = cast(int, row["pid"])
            tid = cast("int | None", row.get("tid"))
            key = str(row["role"])
            out[key] = out.get(key, 0.0) + layout.cpu_seconds(pid, tid)
        return out


@contextlib.asynccontextmanager
async def real_engine(kind: str, lay: Layout) -> AsyncIterator[RealEngine]:
    """Start the engine on the layout's cores; the front end and the compute are pinned once it is ready."""
    if kind == "vllm":
        process = vllm_process(
            scheduling_policy="priority", served_model_name="tiny-llama-priority", max_num_seqs=SLOTS
        )
    elif kind == "llamacpp":
        process = llamacpp_process(slots=SLOTS, threads=1)
    else:  # the simulator, to try the bench itself quickly (its figures mean nothing for the layouts)
        flags = ["--decode-base-ms", "12", "--decode-per-seq-ms", "1"]
        process = sim_process(max_num_seqs=SLOTS, scheduling_policy="priority", extra_args=flags)
    pinned: list[list[dict[str, object]]] = []
    if kind in ("vllm", "sim"):  # as the tests' engines: started on the compute cores, pinned once ready
        layout.lay_out(process, lay, kind, on_pinned=pinned.append)
    else:
        layout.place(process, kind, lay)
    await asyncio.to_thread(process.start)
    engine = RealEngine(kind, process.url, process.served_model_name, process, lay)
    try:
        pid = process.pid
        assert pid is not None
        if kind in ("vllm", "sim"):
            engine.processes = pinned[-1]  # the table as pinned when it was ready
        else:
            async with _session(kind) as session:
                await _direct_once(session, engine, 64)  # warm-up: makes the compute thread the busiest
            engine.processes = layout.pin_llamacpp(pid, lay)
        yield engine
    finally:
        await asyncio.to_thread(process.stop)


def _session(kind: str) -> aiohttp.ClientSession:
    # llama-server closes the connection after each streamed response: no pooled keep-alive there. Elsewhere
    # idle connections close before the engine's keep-alive (vLLM: 5 s) does, as the scheduler's adapters do:
    # a direct run lost 9 latecomers to that race ("Server disconnected") on a busy machine.
    connector = engine_connector(0, force_close=kind == "llamacpp", idle_seconds=HttpSettings().idle_connection_seconds)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


async def _direct_once(session: aiohttp.ClientSession, engine: RealEngine, tokens: int) -> RequestRecord:
    clock = RunClock()
    record = RequestRecord(user="probe", tag="probe", sent=0.0, max_tokens=tokens)
    await DirectClient(session, engine.url, engine.model, clock, "probe").run(record, "How fast is an idle engine?")
    if record.error:
        raise RuntimeError(f"engine probe failed: {record.error}")
    return record


async def calibrate(engine: RealEngine) -> float:
    """Engine output tokens/s with every slot busy (direct): sizes the window the latecomers arrive in. The
    faster of two bursts: the first after start-up ran at 341 tokens/s where the floods then ran at 470-650,
    which put latecomers after the FIFO flood's end (an idle engine answers them at once)."""
    rates = []
    async with _session(engine.kind) as session:
        for _ in range(2):
            started = time.monotonic()
            records = await asyncio.gather(*(_direct_once(session, engine, 128) for _ in range(SLOTS)))
            rates.append(sum(r.tokens for r in records) / (time.monotonic() - started))
    return max(rates)


# ------------------------------------------------------------------------------------------------ probes


@dataclass
class Sample:
    t: float
    waiting: float
    running: float
    generated: float
    steps: float | None = None  # the engine's step counter (None where it exports none)


async def _engine_sampler(
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


async def _gate_sampler(stub: pb_grpc.SchedulerServiceStub, clock: RunClock, out: list[dict[str, Any]]) -> None:
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


# ------------------------------------------------------------------------------------------------ one run


@dataclass(frozen=True)
class Plan:
    """What one round sends, the same for every setup of the round."""

    flood_tokens: list[int]
    latecomers: list[tuple[str, float]]  # (user, offset in seconds after the flood's first send)


def make_plan(workload: Workload, seed: int, late_until: float) -> Plan:
    rng = random.Random(seed)
    tokens = [rng.randint(workload.tokens_min, workload.tokens_max) for _ in range(workload.flood)]
    late = [("B", 1.0), ("C", 2.0)]
    late += [(f"L{seed}-{i:02d}", rng.uniform(0.5, late_until)) for i in range(workload.latecomers)]
    return Plan(tokens, sorted(late, key=lambda item: item[1]))


def _config(engine: RealEngine, setup: Setup) -> str:
    if setup.first_config:
        where = {"engine_url": engine.url, "model": SCHEDULED_MODEL, "engine_model": engine.model}
        if setup.first_config == "example":
            return validated_toml(example_config(**where, max_num_seqs=SLOTS))
        slots = SLOTS if setup.first_config == "minimal_slots" else 0
        return validated_toml(minimal_config(**where, max_num_seqs=slots))
    config = scheduler_config(
        engine_url=engine.url,
        model=SCHEDULED_MODEL,
        engine_model=engine.model,
        max_num_seqs=SLOTS,
        classes=STANDARD_CLASS,
        waiting_target=setup.waiting_target,
        priority_waiting_target=PRIORITY_GATE_TARGET,
        priority_scheduling=setup.engine_priorities,
        scrape_interval=setup.scrape_interval,
    )
    config["models"][0]["backends"][0]["kind"] = "vllm" if engine.kind == "sim" else engine.kind
    config["server"]["event_loop"] = setup.event_loop
    if setup.read_interval is not None:
        config["server"]["stream_read_interval_seconds"] = setup.read_interval
    if setup.adapt_seconds is not None:
        config["models"][0]["gate"]["waiting_target_adapt_seconds"] = setup.adapt_seconds
    if setup.group_at_engine is not None:
        config["server"]["stream_group_at_engine"] = setup.group_at_engine
    return validated_toml(config)


async def run_once(engine: RealEngine, setup: Setup, plan: Plan, baseline_src: Path | None) -> dict[str, Any]:
    """One setup, one round: returns the raw records and samples."""
    clock = RunClock()
    engine_samples: list[Sample] = []
    gates: list[dict[str, Any]] = []
    async with contextlib.AsyncExitStack() as stack:
        session = await stack.enter_async_context(_session(engine.kind))
        idle = (await _direct_once(session, engine, 16)).ttft
        client: Client
        if setup.scheduled:
            wrapper: list[str] = []
            if setup.baseline and baseline_src is not None:
                # -P: the other tree's packages, not those of the working directory (this checkout) first
                wrapper = ["env", f"PYTHONPATH={baseline_src}", sys.executable, "-P"]
            sched = await stack.enter_async_context(harness.scheduler_process(_config(engine, setup), wrapper))
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(sched.target))
            stub = pb_grpc.SchedulerServiceStub(channel)
            client = ScheduledClient(stub, SCHEDULED_MODEL, clock, setup.label)
            warm = RequestRecord(user="warm", tag="warm", sent=0.0, max_tokens=4)
            await client.run(warm, "warm up")  # the scheduler's first reading and connection
        else:
            client = DirectClient(session, engine.url, engine.model, clock, setup.label)
        records: list[RequestRecord] = []
        tasks: list[asyncio.Task[None]] = []

        def send(user: str, tag: str, tokens: int, prompt: str, priority: int | None = None) -> None:
            record = RequestRecord(user=user, tag=tag, sent=clock.now(), max_tokens=tokens)
            records.append(record)
            tasks.append(asyncio.create_task(client.run(record, prompt, engine_priority=priority)))

        def cpu_now() -> dict[str, float]:
            """CPU seconds so far by role: where a layout's cores go (the engine's roles, the scheduler, the
            load generator with its samplers)."""
            out = {**engine.cpu_by_role(), "load generator": time.process_time()}
            if setup.scheduled:
                out["scheduler"] = layout.cpu_seconds(sched.proc.popen.pid)
            return out

        cpu_before = cpu_now()
        clock.reset()
        samplers = [asyncio.create_task(_engine_sampler(session, engine, clock, engine_samples))]
        if setup.scheduled:
            samplers.append(asyncio.create_task(_gate_sampler(stub, clock, gates)))
        try:
            for i, tokens in enumerate(plan.flood_tokens):
                send("A", "flood", tokens, f"User A, batch item {i}: summarise this paragraph for me please.")
            for user, offset in plan.latecomers:
                await asyncio.sleep(max(0.0, offset - clock.now()))
                send(user, "late", 16, f"User {user} asks a short question.", setup.latecomer_priority)
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=600)
            cpu_after = cpu_now()
            cpu = {role: round(cpu_after[role] - cpu_before[role], 2) for role in cpu_after}
        finally:
            for task in [*samplers, *tasks]:
                task.cancel()
            await asyncio.gather(*samplers, *tasks, return_exceptions=True)
    return {"idle_ttft": idle, "records": records, "engine": engine_samples, "gates": gates, "cpu": cpu}


# ------------------------------------------------------------------------------------------------ figures


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _median_and_p90(name: str, values: Sequence[float]) -> dict[str, float | None]:
    """`name` and `name`_p90: the median and 90th percentile of `values` pooled over a setup's rounds."""
    return {name: _median(values), f"{name}_p90": _pct(values, 0.9)}


def next_slot_waits(ends: Sequence[float], arrivals: Sequence[float]) -> list[float]:
    """For each arrival, the seconds until the next request ends after it (a slot frees), as the clients saw
    the ends; arrivals after the last end are left out."""
    ordered = sorted(ends)
    waits = []
    for t in arrivals:
        i = bisect.bisect_right(ordered, t)
        if i < len(ordered):
            waits.append(ordered[i] - t)
    return waits


# two ends closer than this came out of the same engine step: under the shortest step R1 has seen on the CPU
# engine (2.2 ms), so that ends of consecutive steps never chain into one
SAME_STEP = 0.0015


def first_fill_spread(flood: Sequence[RequestRecord]) -> float | None:
    """How far apart the flood's first `SLOTS` requests got their first tokens: about 0 when the engine's
    first batch filled at once. Equal-length answers keep each slot on the phase it started on, so a first
    batch filled one request at a time leaves the slots ending apart for the whole flood."""
    firsts = sorted(r.first_token for r in flood if r.first_token is not None)[:SLOTS]
    return firsts[-1] - firsts[0] if len(firsts) == SLOTS else None


def ends_apart(records: Sequence[RequestRecord]) -> float | None:
    """The share of request ends that came out of a step of their own (more than `SAME_STEP` after the
    previous end). After each such step the engine's running count reads one or more short until its next
    step admits waiting work, so a sample can read a slot empty that no step ran empty."""
    ends = sorted(r.finished for r in records if r.finished is not None)
    if not ends:
        return None
    apart = 1 + sum(1 for before, end in itertools.pairwise(ends) if end - before > SAME_STEP)
    return apart / len(ends)


def turnover_split(records: Sequence[RequestRecord]) -> tuple[list[float], list[float]]:
    """A latecomer's time to first token is mostly the wait for the engine's next free slot (every slot
    busy with the flood, the engine's priority queue puts it first) plus the path to and from the engine.
    This splits the two: the next-slot wait for an arrival at every 10 ms of the latecomers' window (how
    often this setup's engine turns a slot over, whatever moments the latecomers happened to pick), and
    each latecomer's first token after the first slot that freed once it was sent (the path; negative
    when its client saw that end late)."""
    late = [r for r in records if r.tag == "late" and r.first_token is not None]
    if not late:
        return [], []
    lo, hi = min(r.sent for r in late), max(r.sent for r in late)
    grid = [lo + i * 0.01 for i in range(int((hi - lo) / 0.01) + 1)]
    ends = sorted(r.finished for r in records if r.finished is not None)
    turnover = next_slot_waits(ends, grid)
    path = []
    for r in late:
        i = bisect.bisect_right(ends, r.sent)
        if i < len(ends) and ends[i] == r.finished:  # its own end is no slot freed for it
            i += 1
        if i < len(ends) and r.ttft is not None:
            path.append(r.ttft - (ends[i] - r.sent))
    return turnover, path


@dataclass(frozen=True)
class EngineSteps:
    """The engine's own step count through the flood, from its step counter: a flood's span is about the
    steps the engine took times the wall time each took. Steps are mostly what a scheduler controls (a thin
    batch needs more of them for the same tokens); the time per step mostly the engine's speed (here, on a
    shared noisy host, it varied 3.4-4.9 ms between rounds of one setup at the same batch). Only mostly:
    the time per step is wall time over steps, so an engine left idle inside the flood shows there, and a
    step's time grows with its batch."""

    steps: float  # steps over the sampled part of the flood
    tokens_per_step: float  # output tokens per step: the engine's mean batch, by its own count
    seconds_per_step: float


# the samples must have seen this share of the flood's tokens counted, or their counters lagged the engine
STEP_COVERAGE = 0.95


def engine_steps(samples: Sequence[Sample], start: float, end: float, flood_tokens: int) -> EngineSteps | None:
    """Steps between the first and the last sample inside [start, end]. None without a step series, and
    when those samples counted less than `STEP_COVERAGE` of the flood's tokens (a lower bound: the engine's
    counter also counts the latecomers' tokens): a front end starved of CPU
    (the all-shared layout) updates its counters in bursts seconds late, and answers /metrics late too,
    so its counts say when it caught up, not when the engine stepped."""
    inside = [s for s in samples if start <= s.t <= end and s.steps is not None]
    if len(inside) < 2:
        return None
    first, last = inside[0], inside[-1]
    assert first.steps is not None and last.steps is not None
    steps = last.steps - first.steps
    generated = last.generated - first.generated
    if steps <= 0 or generated < STEP_COVERAGE * flood_tokens:
        return None
    return EngineSteps(steps, generated / steps, (last.t - first.t) / steps)


def figures(run: dict[str, Any]) -> dict[str, Any]:
    """One run's figures."""
    records: list[RequestRecord] = run["records"]
    samples: list[Sample] = run["engine"]
    flood = [r for r in records if r.tag == "flood"]
    late = [r for r in records if r.tag == "late"]
    start = min(r.sent for r in flood)
    end = max((r.finished or 0.0) for r in flood)
    span = end - start
    inside = [s for s in samples if start <= s.t <= end]

    def rate(lo: float, hi: float) -> float | None:
        window = [s for s in samples if lo <= s.t <= hi]
        if len(window) < 2 or window[-1].t <= window[0].t:
            return None
        return (window[-1].generated - window[0].generated) / (window[-1].t - window[0].t)

    def queued_at(t: float) -> int:
        return sum(1 for r in records if r.sent <= t and (r.first_token is None or r.first_token > t))

    with_work = [s for s in inside if queued_at(s.t) > 0]
    full = [s for s in with_work if s.running >= SLOTS]
    # a slot empty while the engine itself holds waiting work is the engine between a finish and its next
    # step (every setup shows those); one empty with nothing waiting there is work held back before it
    starved = [s for s in with_work if s.running < SLOTS and s.waiting == 0]
    between_steps = [s for s in with_work if s.running < SLOTS and s.waiting > 0]  # see `ends_apart`
    decode = [r.finished - r.first_token for r in flood if r.finished is not None and r.first_token is not None]
    late_ttft = [r.ttft for r in late if r.ttft is not None]
    turnover, path = turnover_split(records)
    steps = engine_steps(samples, start, end, sum(r.tokens for r in flood))
    return {
        "turnover_wait": _median(turnover),
        "late_path": path,
        "late_hop": [h for r in late if (h := r.scheduler_hop) is not None],
        "late_queue_wait": [r.scheduler_queue_wait for r in late if r.scheduler_queue_wait is not None],
        "late_intake": [r.intake for r in late if r.intake is not None],
        "idle_ttft": run["idle_ttft"],
        "late_ttft": late_ttft,
        "late_missing": sum(1 for r in late if r.ttft is None),
        "late_after_flood": sum(1 for r in late if r.sent > end),  # not behind the flood: an idle engine's TTFT
        "errors": sorted({r.error for r in records if r.error}),
        "span": span,
        "tps_flood": rate(start, end),
        "tps_window": rate(start + span * 0.25, start + span * 0.75),
        "full_share": len(full) / len(with_work) if with_work else None,
        "starved_share": len(starved) / len(with_work) if with_work else None,
        "between_steps_share": len(between_steps) / len(with_work) if with_work else None,
        "ends_apart": ends_apart(records),
        "first_fill_spread": first_fill_spread(flood),
        "mean_running": statistics.fmean(s.running for s in inside) if inside else None,
        "decode": _median(decode),
        "samples": len(inside),
        "steps": steps.steps if steps else None,
        "tokens_per_step": steps.tokens_per_step if steps else None,
        "step_seconds": steps.seconds_per_step if steps else None,
        "cpu": run.get("cpu", {}),
    }


_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def gate_summary(run: dict[str, Any]) -> dict[str, Any]:
    """Where the slots went empty: gate samples with the engine's last reading below a full batch while the
    scheduler held queued work, by reason, and a one-second timeline."""
    gates: list[dict[str, Any]] = run["gates"]
    if not gates:
        return {}
    reasons = Counter(_NUMBER.sub("N", g["reason"]) for g in gates)
    empty = [g for g in gates if g["queued"] > 0 and g["engine_running"] < SLOTS]
    empty_reasons = Counter(("open" if g["open"] else "closed: ") + _NUMBER.sub("N", g["reason"]) for g in empty)
    timeline = []
    for second in range(int(max(g["t"] for g in gates)) + 1):
        bucket = [g for g in gates if second <= g["t"] < second + 1]
        if not bucket:
            continue
        timeline.append(
            {
                "t": second,
                "queued": max(g["queued"] for g in bucket),
                "engine_running": statistics.fmean(g["engine_running"] for g in bucket),
                "engine_waiting": statistics.fmean(g["engine_waiting"] for g in bucket),
                "in_flight": statistics.fmean(g["in_flight"] for g in bucket),
                "sent_unseen": statistics.fmean(g["sent_unseen"] for g in bucket),
                "estimated_waiting": statistics.fmean(g["estimated_waiting"] for g in bucket),
                "age": max(g["age"] for g in bucket),
                "open": sum(g["open"] for g in bucket) / len(bucket),
                "reason": Counter(_NUMBER.sub("N", g["reason"]) for g in bucket).most_common(1)[0][0],
            }
        )
    ages = [g["age"] for g in gates if g["age"] >= 0]
    return {
        "samples": len(gates),
        "reasons": dict(reasons.most_common()),
        "empty_with_queue": len(empty),
        "empty_reasons": dict(empty_reasons.most_common()),
        "reading_age_median": _median(ages),
        "reading_age_p90": _pct(ages, 0.9),
        "timeline": timeline,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _fmt_list(values: Sequence[float | None], fmt: Callable[[float | None], str]) -> str:
    return ", ".join(fmt(v) for v in values)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _decimal(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def summarise(
    engine: str, lay: Layout, workload: Workload, setups: list[Setup], rounds: list[dict[str, dict[str, Any]]]
) -> ScenarioResult:
    """The table, targets and notes for one layout and workload over all its rounds."""
    figs = [{key: figures(run) for key, run in rnd.items()} for rnd in rounds]
    title = f"{engine}, {lay.name}, {workload.name}"
    result = ScenarioResult(f"R1 {title}", f"real engine, {lay.label}", workload.describe(), engine)
    oracle_key = "oracle" if any(s.key == "oracle" for s in setups) else None
    table = Table(
        [
            "setup",
            "latecomer TTFT median (per round)",
            "p90",
            "median ÷ oracle",
            "p90 ÷ oracle",
            "flood span ÷ FIFO (per round)",
            "tokens/s whole flood (window)",
            "slots full while work waits",
            "idle TTFT",
        ]
    )
    agg: dict[str, dict[str, Any]] = {}
    for setup in setups:
        per = [f[setup.key] for f in figs if setup.key in f]
        pooled = [t for p in per for t in p["late_ttft"]]
        paired = [f for f in figs if setup.key in f and "fifo" in f]  # the rounds with FIFO to compare against
        spans = [_ratio(f[setup.key]["span"], f["fifo"]["span"]) for f in paired]
        step_times = [_ratio(f[setup.key]["step_seconds"], f["fifo"]["step_seconds"]) for f in paired]
        # counted by the engine over each run's sampled window; span ÷ FIFO's is about the product of the two
        step_counts = [_ratio(f[setup.key]["steps"], f["fifo"]["steps"]) for f in paired]
        agg[setup.key] = {
            "median": _median(pooled),
            "p90": _pct(pooled, 0.9),
            "round_medians": [_median(p["late_ttft"]) for p in per],
            "span_ratios": spans,
            "span_ratio": _median([s for s in spans if s is not None]),
            "spans": [p["span"] for p in per],
            "step_count_ratios": step_counts,
            "step_count_ratio": _median([r for r in step_counts if r is not None]),
            "step_time_ratios": step_times,
            "step_time_ratio": _median([r for r in step_times if r is not None]),
            "tokens_per_step": [p["tokens_per_step"] for p in per],
            "tps_flood": [p["tps_flood"] for p in per],
            "tps_window": [p["tps_window"] for p in per],
            "full_share": _median([p["full_share"] for p in per if p["full_share"] is not None]),
            "full_shares": [p["full_share"] for p in per],
            "starved_shares": [p["starved_share"] for p in per],
            "between_steps_shares": [p["between_steps_share"] for p in per],
            "ends_apart": [p["ends_apart"] for p in per],
            "first_fill_spreads": [p["first_fill_spread"] for p in per],
            "idle": _median([p["idle_ttft"] for p in per if p["idle_ttft"] is not None]),
            "decode": _median([p["decode"] for p in per if p["decode"] is not None]),
            "missing": sum(p["late_missing"] for p in per),
            "after_flood": sum(p["late_after_flood"] for p in per),
            "errors": sorted({e for p in per for e in p["errors"]}),
            "n": len(pooled),
            "turnover_waits": [p["turnover_wait"] for p in per],
            **_median_and_p90("path", [t for p in per for t in p["late_path"]]),
            **_median_and_p90("hop", [t for p in per for t in p["late_hop"]]),
            **_median_and_p90("queue_wait", [t for p in per for t in p["late_queue_wait"]]),
            **_median_and_p90("intake", [t for p in per for t in p["late_intake"]]),
            "cpu": {
                role: _median([p["cpu"][role] for p in per if role in p["cpu"]])
                for role in sorted({role for p in per for role in p["cpu"]})
            },
        }
    oracle = agg.get(oracle_key) if oracle_key else None
    for setup in setups:
        a = agg[setup.key]
        med_ratio = _ratio(a["median"], oracle["median"]) if oracle else None
        p90_ratio = _ratio(a["p90"], oracle["p90"]) if oracle else None
        a["median_vs_oracle"], a["p90_vs_oracle"] = med_ratio, p90_ratio
        table.rows.append(
            [
                setup.label,
                f"{seconds(a['median'])} ({_fmt_list(a['round_medians'], seconds)}; n={a['n']})",
                seconds(a["p90"]),
                _x(med_ratio),
                _x(p90_ratio),
                f"{_x(a['span_ratio'])} ({_fmt_list(a['span_ratios'], _x)})",
                f"{_fmt_list(a['tps_flood'], lambda v: '-' if v is None else f'{v:.0f}')} "
                f"({_fmt_list(a['tps_window'], lambda v: '-' if v is None else f'{v:.0f}')})",
                f"{_fmt_list(a['full_shares'], lambda v: '-' if v is None else f'{v:.0%}')}",
                seconds(a["idle"]),
            ]
        )
        if a["path"] is not None:
            result.notes.append(
                f"{setup.label}: next free slot {_fmt_list(a['turnover_waits'], seconds)} after a random moment "
                f"of the latecomers' window (median per round: how often the engine turned a slot over); first "
                f"token {seconds(a['path'])} (p90 {seconds(a['path_p90'])}) after the first slot that freed once "
                "a latecomer was sent (the path)"
            )
        if a["hop"] is not None:
            result.notes.append(
                f"{setup.label}: a latecomer's time to first token at its client minus at the scheduler (from "
                f"admitting it): {seconds(a['hop'])} (p90 {seconds(a['hop_p90'])}), the request's way in and its "
                f"first token's way out through the scheduler; held in the scheduler's queue "
                f"{seconds(a['queue_wait'])} (p90 {seconds(a['queue_wait_p90'])})"
            )
        if a["intake"] is not None:
            result.notes.append(
                f"{setup.label}: the engine's front end took a latecomer's request in (from its sending to the "
                f"engine's response headers) in {seconds(a['intake'])} (p90 {seconds(a['intake_p90'])}); one "
                "that arrives after a slot turned over waits for the next turnover"
            )
        if any(a["tokens_per_step"]):
            result.notes.append(
                f"{setup.label}: the engine's own step count over the flood ÷ FIFO's {_x(a['step_count_ratio'])} "
                f"({_fmt_list(a['step_count_ratios'], _x)}), time per step ÷ FIFO's {_x(a['step_time_ratio'])} "
                f"({_fmt_list(a['step_time_ratios'], _x)}): span ÷ FIFO's is about their product; output tokens per "
                f"step (the engine's mean batch) {_fmt_list(a['tokens_per_step'], _decimal)}"
            )
        if any(a["starved_shares"]):
            result.notes.append(
                f"{setup.label}: slots empty with nothing waiting at the engine while clients' work was queued "
                f"(held back before the engine), share of samples per round: "
                f"{_fmt_list(a['starved_shares'], _percent)}"
            )
        if any(share is not None for share in a["between_steps_shares"]):
            result.notes.append(
                f"{setup.label}: slots read short while the engine itself held waiting work (a finish read "
                "before the engine's next step admits a waiting request), share of samples "
                f"per round: {_fmt_list(a['between_steps_shares'], _percent)}; ends out of a step of their own: "
                f"{_fmt_list(a['ends_apart'], _percent)} of all (each one such reading); the flood's first "
                f"{SLOTS} first tokens spread over {_fmt_list(a['first_fill_spreads'], seconds)} (the slots' phases)"
            )
        if a["cpu"]:
            shares = ", ".join(f"{role} {value:.1f}" for role, value in a["cpu"].items() if value is not None)
            result.notes.append(f"{setup.label}: CPU seconds per run by role (median over rounds): {shares}")
        if a["after_flood"]:
            result.notes.append(f"{setup.label}: {a['after_flood']} latecomers sent after the flood's last token")
        if a["missing"] or a["errors"]:
            result.notes.append(f"{setup.label}: {a['missing']} latecomers without a token; errors {a['errors']}")
    result.table = table
    _targets(result, lay, setups, agg)
    gate_runs = {
        setup.key: [gate_summary(rnd[setup.key]) for rnd in rounds if setup.key in rnd]
        for setup in setups
        if setup.scheduled
    }
    result.raw = {"aggregate": jsonable(agg), "rounds": jsonable(figs), "gates": jsonable(gate_runs)}
    result.series = {
        "runs": [
            {
                key: {
                    "records": [r.summary() for r in run["records"]],
                    "engine": [[s.t, s.waiting, s.running, s.generated, s.steps] for s in run["engine"]],
                    "gates": run["gates"],
                }
                for key, run in rnd.items()
            }
            for rnd in rounds
        ]
    }
    return result


def _targets(result: ScenarioResult, lay: Layout, setups: list[Setup], agg: dict[str, dict[str, Any]]) -> None:
    keys = {s.key for s in setups}
    fifo = agg.get("fifo", {})
    for key in ("sched", "sched_base"):
        if key not in keys:
            continue
        a = agg[key]
        label = next(s.label for s in setups if s.key == key)
        if lay.name == "gpu_host":
            result.targets += [
                Target("latecomer TTFT median ÷ oracle", "<= 1.1x", label, a["median_vs_oracle"], 1.1, 1.5, False, "x"),
                Target("latecomer TTFT p90 ÷ oracle", "<= 1.25x", label, a["p90_vs_oracle"], 1.25, 1.6, False, "x"),
                Target("flood span ÷ FIFO (median)", "<= 1.05x", label, a["span_ratio"], 1.05, 1.15, False, "x"),
            ]
            if a["full_share"] is not None and fifo.get("full_share") is not None:
                result.targets.append(
                    Target(
                        "slots full while work waits, minus FIFO's",
                        ">= -2 points",
                        label,
                        a["full_share"] - fifo["full_share"],
                        -0.02,
                        -0.10,
                        True,
                        "%",
                    )
                )
        elif lay.name == "starved":
            result.targets += [
                Target("latecomer TTFT median ÷ oracle", "<= 1.5x", label, a["median_vs_oracle"], 1.5, 2.0, False, "x"),
                Target("flood span ÷ FIFO (median)", "<= 1.05x", label, a["span_ratio"], 1.05, 1.15, False, "x"),
            ]
        elif lay.name == "shared":
            result.targets += [
                Target("flood span ÷ FIFO (median)", "<= 1.15x", label, a["span_ratio"], 1.15, 1.3, False, "x"),
                Target(
                    "latecomer TTFT median, FIFO ÷ scheduler",
                    ">= 10x",
                    label,
                    _ratio(fifo.get("median"), a["median"]),
                    10.0,
                    8.0,
                    True,
                    "x",
                ),
            ]
    if "sched_off" in keys and lay.name == "gpu_host":
        a = agg["sched_off"]
        idle = fifo.get("idle") or a["idle"] or 0.0
        decode = fifo.get("decode") or a["decode"] or 0.0
        bound = 2 * idle + decode
        result.targets.append(
            Target(
                "latecomer TTFT median, priorities off",
                f"<= 2 x idle TTFT + one request's decode time = {bound:.2f} s",
                next(s.label for s in setups if s.key == "sched_off"),
                a["median"],
                bound,
                bound * 1.25,
                False,
                " s",
            )
        )


# ------------------------------------------------------------------------------------------------ driver


def _markdown(result: ScenarioResult, meta: dict[str, Any]) -> str:
    from bench.report import scenario_markdown

    lines = [scenario_markdown(result), ""]
    lines.append(f"Host: {meta.get('host')}; engine processes: ")
    lines += [f"- {row}" for row in meta.get("processes", [])]
    lines.append(f"- engine CPU seconds by role over the layout's runs: {meta.get('engine_cpu')}")
    for key, runs in result.raw.get("gates", {}).items():
        for i, summary in enumerate(runs):
            if not summary:
                continue
            lines.append(
                f"\nGate samples, {key}, round {i + 1}: {summary['samples']} samples, reading age median "
                f"{summary['reading_age_median']}, p90 {summary['reading_age_p90']}; samples with the engine "
                f"below {SLOTS} running while the scheduler held work: {summary['empty_with_queue']}"
            )
            lines.append(f"- reasons: {summary['reasons']}")
            lines.append(f"- reasons when slots were empty with work queued: {summary['empty_reasons']}")
            lines.append(
                "\n| t (s) | sched queued | engine running | engine waiting | in flight | sent unseen | "
                "est. waiting | max age | gate open | main reason |\n|---|---|---|---|---|---|---|---|---|---|"
            )
            for row in summary["timeline"]:
                lines.append(
                    f"| {row['t']} | {row['queued']} | {row['engine_running']:.1f} | {row['engine_waiting']:.1f} | "
                    f"{row['in_flight']:.1f} | {row['sent_unseen']:.1f} | {row['estimated_waiting']:.1f} | "
                    f"{row['age']:.2f} | {row['open']:.0%} | {row['reason']} |"
                )
    return "\n".join(lines) + "\n"


async def run_layout(
    engine_kind: str,
    lay: Layout,
    workloads: list[Workload],
    rounds: int,
    baseline_src: Path | None,
    out_dir: Path,
    only: Sequence[str] = (),
) -> list[ScenarioResult]:
    """Every workload's rounds on one engine laid out as `lay`."""
    why = layout.available(lay)
    if why:
        return [ScenarioResult.unavailable(f"R1 {engine_kind}, {lay.name}", lay.label, "-", why)]
    os.sched_setaffinity(0, lay.load_cpus or layout.all_cpus())  # the load generator (and the scheduler it starts)
    setups = [s for s in setups_for(engine_kind, baseline_src is not None) if not only or s.key in only]
    setups += [
        s
        for s in ON_REQUEST
        if s.key in only and engine_kind != "llamacpp" and (not s.baseline or baseline_src is not None)
    ]
    out: list[ScenarioResult] = []
    try:
        async with real_engine(engine_kind, lay) as engine:
            cpu_before = engine.cpu_by_role()
            load_start = os.getloadavg()
            tps = await calibrate(engine)
            print(f"[{lay.name}] engine up, {tps:.0f} tokens/s at a full batch; processes {engine.processes}")
            for workload in workloads:
                total = sum(range(workload.tokens_min, workload.tokens_max + 1)) / (
                    workload.tokens_max - workload.tokens_min + 1
                )
                late_until = max(3.0, 0.8 * workload.flood * total / tps)
                done: list[dict[str, dict[str, Any]]] = []
                for r in range(rounds):
                    plan = make_plan(workload, seed=100 + r, late_until=late_until)
                    order = setups[r % len(setups) :] + setups[: r % len(setups)]  # rotate: no setup always first
                    rnd: dict[str, dict[str, Any]] = {}
                    for setup in order:
                        began = time.monotonic()
                        rnd[setup.key] = await run_once(engine, setup, plan, baseline_src)
                        f = figures(rnd[setup.key])
                        print(
                            f"[{lay.name} {workload.name} r{r + 1}] {setup.key}: late median "
                            f"{_median(f['late_ttft']) or 0:.2f}s p90 {_pct(f['late_ttft'], 0.9) or 0:.2f}s span "
                            f"{f['span']:.1f}s full {f['full_share'] or 0:.0%} ({time.monotonic() - began:.0f}s, "
                            f"load {os.getloadavg()[0]:.1f})",
                            flush=True,
                        )
                    done.append(rnd)
                result = summarise(engine_kind, lay, workload, setups, done)
                cpu_after = engine.cpu_by_role()
                meta = {
                    "host": f"{os.cpu_count()} CPUs, load average {load_start[0]:.1f} at start, "
                    f"{os.getloadavg()[0]:.1f} at end (1 min)",
                    "processes": engine.processes,
                    "engine_cpu": {k: round(cpu_after[k] - cpu_before.get(k, 0.0), 1) for k in cpu_after},
                    "calibrated_tokens_per_second": tps,
                    "latecomers_until": late_until,
                }
                result.notes.append(f"host: {meta['host']}; engine CPU seconds by role: {meta['engine_cpu']}")
                result.raw["meta"] = jsonable(meta)
                name = f"r1-{engine_kind}-{lay.name}-{workload.name}"
                (out_dir / f"{name}.md").write_text(_markdown(result, meta))
                (out_dir / f"{name}.json").write_text(
                    json.dumps({"raw": result.raw, "series": jsonable(result.series)}, default=str)
                )
                print(f"wrote {out_dir / name}.md", flush=True)
                result.series = {}  # the per-request series stay in the layout's own JSON file
                out.append(result)
    finally:
        os.sched_setaffinity(0, layout.all_cpus())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scenarios.real_s1", description=__doc__)
    parser.add_argument("--engine", choices=("vllm", "llamacpp", "sim"), default="vllm")
    parser.add_argument("--layouts", default="gpu_host", help="comma-separated: gpu_host,starved,shared")
    parser.add_argument("--workloads", default="flood", help="comma-separated: flood,mixed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flood", type=int, default=0, help="flood size (default: the workload's 64)")
    parser.add_argument(
        "--setups",
        default="",
        help="only these setup keys (sched,oracle,fifo,sched_off,sched_base; on request: sched_asyncio, "
        "sched_every_token, sched_paced, sched_read_paced, sched_off_target_1, sched_off_fixed, and a user's first "
        "config: first_minimal, first_minimal_slots, first_example, first_minimal_base)",
    )
    parser.add_argument(
        "--baseline-src", type=Path, help="a source tree for the sched_base setup (another version side by side)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "real")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    only = [s for s in args.setups.split(",") if s]

    async def go() -> list[ScenarioResult]:
        out: list[ScenarioResult] = []
        for name in args.layouts.split(","):
            out += await run_layout(
                args.engine,
                layout.LAYOUTS[name],
                [
                    dataclasses.replace(WORKLOADS[w], flood=args.flood or WORKLOADS[w].flood)
                    for w in args.workloads.split(",")
                ],
                args.rounds,
                args.baseline_src,
                args.out,
                only,
            )
        return out

    from bench.report import scenario_markdown

    for result in asyncio.run(go()):
        print(scenario_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())


DEFINITION = Definition(
    id="R1",
    title="flood + latecomers on a real engine",
    question="On a real engine, do latecomers behind a flood do as well through the scheduler as with the "
    "engine's own priority queue, without slowing the flood?",
    workload=f"flood: {WORKLOADS['flood'].describe()}; mixed: the same with {WORKLOADS['mixed'].tokens_min}-"
    f"{WORKLOADS['mixed'].tokens_max}-token flood answers",
    layout=f"real CPU vLLM ({SLOTS} slots, started with --scheduling-policy priority) or llama.cpp's server, in "
    "three core layouts: " + "; ".join(f"{lay.name}: {lay.label}" for lay in layout.LAYOUTS.values()) + ". Every "
    "round runs each setup once on the same engine: the scheduler (engine priorities on), the oracle (vLLM's "
    "own priority queue, latecomers sending priority -1 straight to the engine), the engine's FIFO, and the "
    "scheduler with engine priorities off (pure gating; the only scheduler setup on llama.cpp)",
    measures="latecomer TTFT median and p90 against the oracle's (pooled over the rounds), the flood's span "
    "against FIFO's in the same round, the share of engine samples with every slot busy while work waits, the "
    "span split into the engine's step count and time per step, the engine's intake of each request",
    targets=(
        "GPU host: latecomer median <= 1.1x the oracle's, p90 <= 1.25x; span <= 1.05x FIFO's; slots full "
        "while work waits no more than 2 points below FIFO's",
        "GPU host, priorities off: latecomer median <= 2 x idle TTFT + one request's decode time",
        "front end starved: latecomer median <= 1.5x the oracle's; span <= 1.05x FIFO's",
        "all shared: latecomer median >= 10x better than FIFO's; span <= 1.15x FIFO's",
    ),
    command="python -m bench --engine vllm --scenarios R1",
    duration="about 10 minutes a layout and workload at 3 rounds; make bench ENGINE=vllm or ENGINE=llamacpp installs "
    "the engine once (into ENGINES_CACHE) and runs it; --layouts gpu_host --workloads flood,mixed --rounds 3 narrow "
    "or widen it",
    facts=(
        "A latecomer's time to first token is the wait for the engine's next free slot plus the path to its "
        "first token (about 10 ms). Equal-length answers started together end together, so slots free in waves, "
        "and where a round's latecomers land between waves moves the ratio of a 3-round run against the oracle "
        "from about 0.85x to 1.7x with the same code (the oracle's own round medians spread as widely); pooled "
        "over many rounds the scheduler's latecomer median is within about 10% of the oracle's, and its p90 "
        "matches the oracle's.",
        "When vLLM's HTTP front end shares a busy core with the scheduler and the load, it can take the "
        "scheduler's requests in more slowly than a direct client's (R1 reports both sides' intake, and the "
        "service exports its own as llmsched_engine_accept_seconds): that additive cost, not the gate's choices, "
        "is what separates the scheduler from vLLM's own priority queue there.",
        "At a priority engine a queue of 6 (gate.priority_waiting_target) costs latecomers nothing, since they "
        "jump it, and keeps every slot busy while the busy front end hands requests in late; with 3, slots "
        "empty.",
        "Grouping streamed tokens within 50 ms (server.stream_read_interval_seconds = 0.05, the default) halves "
        "the scheduler's CPU per token and cuts vLLM's front end's, the process that takes new requests in and "
        "on a GPU host shares the scheduler's core; it costs a long answer's tokens up to about 50 ms of delay "
        "(twice that with vLLM's own grouping), never the first token or the end of an answer. Side by side, "
        "latecomers were faster grouped in some runs and slower in others, within the spread between runs.",
        "All shared, the scheduler's CPU comes out of vLLM's two OpenMP threads, and a step waits for both, so "
        "each second taken costs about two: the flood's span grows, which is why that layout's span target is "
        "1.15x.",
        "Without engine priorities the gate learns to keep the engine's queue only as deep as its slots need "
        "(gate.waiting_target_adapt_seconds): a queue of 1 instead of 3 gives latecomers their first token "
        "about a third sooner, the span unchanged.",
        "Serving the latecomers inside the flood costs the engine a few percent more steps than FIFO, which "
        "serves them after the flood's last token; the oracle pays the same.",
    ),
    headline=("latecomer TTFT median ÷ oracle",),
)

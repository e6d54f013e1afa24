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

    python -m bench --engine vllm --scenarios R1 --layouts gpu_host --workloads flood --rounds 3
    python -m bench --scenarios R1 --layouts gpu_host --rounds 1     the simulator standing in: tries the bench

The package's modules by job: `setups` (workloads, the round's plan, the setups), `engine` (the engine laid
out on the cores), `sampling` and `run` (one setup through one round), `figures`, `gates`, `summary` and
`targets` (from the rounds to the result); this module runs the layouts' rounds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.engines import EngineProvider
from bench.results import ScenarioResult
from bench.scenario import Definition, Options, Scenario
from bench.scenarios.common import jsonable, median
from bench.scenarios.r1.engine import RealEngine, calibrate, real_engine
from bench.scenarios.r1.figures import nearest_rank, run_figures
from bench.scenarios.r1.gates import layout_markdown
from bench.scenarios.r1.one_run import run_once
from bench.scenarios.r1.setups import (
    ON_REQUEST,
    SLOTS,
    WORKLOADS,
    Setup,
    Workload,
    latecomers_until,
    make_plan,
    result_suffix,
    setups_for,
)
from bench.scenarios.r1.summary import summarise
from engines import layout
from engines.layout import Layout


async def run(provider: EngineProvider, options: Options) -> list[ScenarioResult]:
    """Every layout `options.real` names, in turn, on the engine `options.engine` names (the simulator stands
    in for a real engine to try the bench itself; its figures mean nothing for the layouts)."""
    real = options.real
    workloads = [dataclasses.replace(WORKLOADS[w], flood=real.flood or WORKLOADS[w].flood) for w in real.workloads]
    out: list[ScenarioResult] = []
    for name in real.layouts:
        started = time.monotonic()
        produced = await run_layout(
            options.engine,
            layout.LAYOUTS[name],
            workloads,
            real.rounds,
            real.baseline_src,
            options.out_dir,
            real.setups,
        )
        for result in produced:
            result.seconds = (time.monotonic() - started) / len(produced)
        out += produced
    return out


async def run_layout(
    engine_kind: str,
    lay: Layout,
    workloads: list[Workload],
    rounds: int,
    baseline_src: Path | None,
    out_dir: Path,
    only: Sequence[str] = (),
) -> list[ScenarioResult]:
    """Every workload's rounds on one engine laid out as `lay`; each workload's result also written to its own
    Markdown and JSON files in `out_dir` (with the gate samples and the per-request series)."""
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
                late_until = latecomers_until(workload, tps)
                done = [await _round(engine, workload, setups, r, late_until, baseline_src) for r in range(rounds)]
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
                name = f"r1-{engine_kind}-{lay.name}-{workload.name}" + (
                    "-first_configs" if result_suffix(setups) else ""
                )
                (out_dir / f"{name}.md").write_text(layout_markdown(result, meta))
                (out_dir / f"{name}.json").write_text(
                    json.dumps({"raw": result.raw, "series": jsonable(result.series)}, default=str)
                )
                print(f"wrote {out_dir / name}.md", flush=True)
                result.series = {}  # the per-request series stay in the layout's own JSON file
                out.append(result)
    finally:
        os.sched_setaffinity(0, layout.all_cpus())
    return out


async def _round(
    engine: RealEngine, workload: Workload, setups: list[Setup], r: int, late_until: float, baseline: Path | None
) -> dict[str, dict[str, Any]]:
    """Round `r`: every setup once through the round's plan, in an order rotated by round (no setup always
    runs first)."""
    plan = make_plan(workload, seed=100 + r, late_until=late_until)
    order = setups[r % len(setups) :] + setups[: r % len(setups)]
    done: dict[str, dict[str, Any]] = {}
    for setup in order:
        began = time.monotonic()
        done[setup.key] = await run_once(engine, setup, plan, baseline)
        f = run_figures(done[setup.key])
        print(
            f"[{engine.layout.name} {workload.name} r{r + 1}] {setup.key}: late median "
            f"{median(f['late_ttft']) or 0:.2f}s p90 {nearest_rank(f['late_ttft'], 0.9) or 0:.2f}s span "
            f"{f['span']:.1f}s full {f['full_share'] or 0:.0%} ({time.monotonic() - began:.0f}s, "
            f"load {os.getloadavg()[0]:.1f})",
            flush=True,
        )
    return done


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
        "a user's first configs (on request, a result of its own): the minimal config's latecomer median <= "
        "1.1x configs/example.toml's in the same rounds",
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
        "A user's first config, the model and a priority vLLM and nothing else, gets latecomers what "
        "configs/example.toml gets (`--setups oracle,fifo,first_minimal,first_minimal_slots,first_example`): "
        "in three runs of 5, 10 and 10 rounds its latecomer median was 1.09x, 1.12x and 1.00x the example's "
        "(against the oracle 1.50x, 1.00x and 1.09x; the example 1.38x, 0.89x and 1.09x), and per round each "
        "ranged from about a third to twice the oracle's median. The same minimal config with round robin, a "
        "waiting target of 3 and the slots unknown (`first_minimal_base` on a scheduler tree with those "
        "defaults, `--baseline-src`) ran at 0.81x the oracle in the second run's rounds: with one user flooding "
        "4 slots, R1 does not tell these settings apart beyond its spread.",
    ),
    headline=("latecomer TTFT median ÷ oracle", "latecomer TTFT median, minimal config ÷ configs/example.toml"),
)
SCENARIO = Scenario((DEFINITION,), run, engines=("vllm", "llamacpp"))

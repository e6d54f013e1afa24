"""Run the benchmark scenarios side by side (engine alone vs through llm-scheduler) and report them.

    python -m bench                          S1-S8 and the cluster scenarios against the simulator
    python -m bench --engine vllm            R1 (S1/S2 on real vLLM in three core layouts), S6, S8
    python -m bench --engine llamacpp        R1 on the real llama.cpp server
    python -m bench --engine vllm --scenarios R1 --layouts gpu_host --workloads flood,mixed
    python -m bench --scenarios R1 --layouts gpu_host --rounds 1   R1 on the simulator: tries the bench itself
    python -m bench --engine vllm --scenarios R1 --setups sched,fifo,sched_asyncio --flood 32
    python -m bench --scenarios S1,S6        a subset (S2 comes with S1)
    python -m bench --check                  run, then fail (exit 1) on a regression past tolerance
    python -m bench --check --from-json bench/results/results.json    check a saved run (and redraw its plots)
    python -m bench --scenarios S6 --profile also profile the scheduler at S6's fixed rate
    python -m bench --scenarios C1,C3,C4,C6,CB   the cluster scenarios: one process, N memory-mode
                                             replicas and N replicas on Redis, side by side
    python -m bench --scenarios CL,CN        a model's leader's CPU per follower request, in a cluster and
                                             under synthetic followers' load; Redis per request
    python -m bench --scenarios CB --cluster-stores memory --cluster-scale 3   no Redis runs, 3x the windows

Writes, under --out (bench/results, or bench/results/vllm): results.json (every raw figure), RESULTS.md (a
table per scenario, targets met or missed) and the PNG plots; and a record of the run (commit, date, machine,
setup, every figure with its target) into bench/results/records/, which the docs' tables are rendered from
(`make docs`). The scenarios are listed in bench/registry.py, each defined beside its code in
bench/scenarios/, and described in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import check, report, results, session
from bench.cluster import STORES, ClusterOptions
from bench.engines import EngineProvider, SimProfile, SimProvider, VllmProvider
from bench.scenario import Options, RealEngineOptions
from engines import layout

REAL_WORKLOADS = ("flood", "mixed")  # R1's workloads (bench.scenarios.r1.setups.WORKLOADS)


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line; `args.cluster` and `args.real` hold the cluster scenarios' and R1's knobs."""
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=("sim", "vllm", "llamacpp"), default="sim")
    parser.add_argument("--scenarios", help="comma-separated ids, e.g. S1,S3 (default: all for the engine)")
    parser.add_argument("--out", type=Path, help="output folder (default bench/results[/vllm])")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target regressed past its tolerance")
    parser.add_argument("--from-json", type=Path, help="report/check a saved results.json instead of running")
    parser.add_argument("--profile", action="store_true", help="S6: also profile the scheduler with pyinstrument")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNGs (matplotlib not needed)")
    parser.add_argument("--no-record", action="store_true", help="write no record into bench/results/records")
    real = parser.add_argument_group("R1 (real engines, or the simulator when asked for by id)")
    real.add_argument("--layouts", default="gpu_host,starved,shared", help="core layouts: gpu_host,starved,shared")
    real.add_argument("--workloads", default="flood", help="workloads: flood,mixed")
    real.add_argument("--rounds", type=int, default=3, help="rounds (every setup once per round)")
    real.add_argument("--setups", default="", help="only these setup keys (sched,oracle,fifo,sched_off,sched_base; "
                      "on request: sched_scrape_01, sched_asyncio, sched_every_token, sched_paced, sched_read_paced, "
                      "sched_off_target_1, sched_off_fixed, and a user's first config: first_minimal, "
                      "first_minimal_slots, first_example, first_minimal_base)")  # fmt: skip
    real.add_argument("--flood", type=int, default=0, help="the flood's size (default: the workload's 64)")
    real.add_argument("--baseline-src", type=Path, help="a source tree for the sched_base setup, side by side")
    cluster = parser.add_argument_group("the cluster scenarios")
    cluster.add_argument("--replicas", type=int, default=3, help="scheduler replicas (default 3)")
    cluster.add_argument(
        "--cluster-stores",
        default="memory,redis",
        help="which N-replica layouts run beside the "
        "single process: memory (independent processes), redis (one cluster), or both (default)",
    )
    cluster.add_argument("--cluster-scale", type=float, default=1.0, help="stretch the measuring windows")
    args = parser.parse_args(argv)
    stores = _names(args.cluster_stores)
    if not set(stores) <= set(STORES) or not 1 <= args.replicas <= 16 or not 0.1 <= args.cluster_scale <= 100:
        parser.error("--cluster-stores takes memory and/or redis, --replicas 1-16, --cluster-scale 0.1-100")
    layouts, workloads = _names(args.layouts), _names(args.workloads)
    if not set(layouts) <= set(layout.LAYOUTS) or not set(workloads) <= set(REAL_WORKLOADS) or args.rounds < 1:
        parser.error(f"--layouts takes {','.join(layout.LAYOUTS)}, --workloads flood and/or mixed, --rounds >= 1")
    args.cluster = ClusterOptions(replicas=args.replicas, stores=stores, scale=args.cluster_scale)
    args.real = RealEngineOptions(layouts, workloads, args.rounds, _names(args.setups), args.flood, args.baseline_src)
    return args


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def provider(engine: str) -> EngineProvider:
    """The engines the scenarios run against; exits with the reason when a real engine is not installed."""
    if engine == "llamacpp":
        from engines import llamacpp_missing_reason

        reason = llamacpp_missing_reason()
        if reason:
            sys.exit(f"--engine llamacpp: {reason}")
        return VllmProvider()  # only R1 runs on llama.cpp; the provider is never asked for an engine
    if engine == "vllm":
        reason = VllmProvider.missing_reason()
        if reason:
            sys.exit(f"--engine vllm: {reason}")
        return VllmProvider()
    return SimProvider(SimProfile())


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.from_json:
        loaded, _ = results.load(args.from_json)
        if not args.no_plots:
            session.draw_plots(loaded, args.from_json.parent)
    else:
        out_dir = args.out or session.ROOT / "bench" / "results" / ("" if args.engine == "sim" else args.engine)
        options = Options(out_dir, args.engine, args.profile, args.cluster, args.real)
        ids = [i.upper() for i in _names(args.scenarios or "")]
        loaded = session.run_and_write(provider(args.engine), ids, options, args)
    for result in loaded:
        print(report.scenario_markdown(result))
    if args.check:
        text, failed = check.evaluate(loaded)
        print(text)
        return 1 if failed else 0
    return 0

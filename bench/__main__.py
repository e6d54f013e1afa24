"""Run the benchmark scenarios side by side (engine alone vs through llm-scheduler) and report them.

    python -m bench                          S1-S6 against the simulator (a few minutes)
    python -m bench --engine vllm            R1 (S1/S2 on real vLLM in three core layouts), S6
    python -m bench --engine llamacpp        R1 on the real llama.cpp server
    python -m bench --engine vllm --scenarios R1 --layouts gpu_host --workloads flood,mixed
    python -m bench --scenarios S1,S6        a subset (S2 comes with S1)
    python -m bench --check                  run, then fail (exit 1) on a regression past tolerance
    python -m bench --check --from-json bench/results/results.json    check a saved run, no rerun
    python -m bench --scenarios S6 --profile also profile the scheduler at S6's fixed rate
    python -m bench --scenarios C1,C3,C4,C6,CB   the cluster scenarios: one process, N memory-mode
                                             replicas and N replicas on Redis, side by side
    python -m bench --scenarios CL,CN        a model's leader's CPU per follower request, in a cluster and
                                             under synthetic followers' load; Redis per request
    python -m bench --scenarios CB --cluster-stores memory --cluster-scale 3   no Redis runs, 3x the windows

Writes, under --out (bench/results, or bench/results/vllm): results.json (every raw figure), RESULTS.md (a
table per scenario, targets met or missed) and the PNG plots; and a record of the run (commit, date, machine,
setup, every figure with its target) into bench/results/records/, which the docs' tables are rendered from
(`make docs`). The scenarios themselves are defined in bench/scenarios/ and listed in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench import check, report, results, run_records
from bench.cluster import STORES
from bench.engines import EngineProvider, SimProfile, SimProvider, VllmProvider
from bench.scenarios import DEFAULT, SCENARIOS, TITLES, Options, entries_for
from bench.scenarios._cluster import ClusterOptions

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "bench" / "figures"
FIGURE = "s1_ttft.png"  # the one plot the docs show


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=("sim", "vllm", "llamacpp"), default="sim")
    parser.add_argument("--layouts", default="gpu_host,starved,shared", help="R1's core layouts (real engines)")
    parser.add_argument("--workloads", default="flood", help="R1's workloads: flood,mixed")
    parser.add_argument("--rounds", type=int, default=3, help="R1's rounds (every setup once per round)")
    parser.add_argument("--scenarios", help="comma-separated ids, e.g. S1,S3 (default: all for the engine)")
    parser.add_argument("--out", type=Path, help="output folder (default bench/results[/vllm])")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target regressed past its tolerance")
    parser.add_argument("--from-json", type=Path, help="report/check a saved results.json instead of running")
    parser.add_argument("--profile", action="store_true", help="S6: also profile the scheduler with pyinstrument")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNGs (matplotlib not needed)")
    parser.add_argument(
        "--no-record", action="store_true", help="write no record into bench/results/records (a trial run)"
    )
    parser.add_argument("--replicas", type=int, default=3, help="cluster scenarios: scheduler replicas (default 3)")
    parser.add_argument(
        "--cluster-stores",
        default="memory,redis",
        help="cluster scenarios: which N-replica layouts run beside the single process: memory (independent "
        "processes), redis (one cluster), or both (default)",
    )
    parser.add_argument(
        "--cluster-scale", type=float, default=1.0, help="cluster scenarios: stretch the measuring windows"
    )
    args = parser.parse_args(argv)
    stores = tuple(s.strip() for s in args.cluster_stores.split(",") if s.strip())
    if not set(stores) <= set(STORES) or not 1 <= args.replicas <= 16 or not 0.1 <= args.cluster_scale <= 100:
        parser.error("--cluster-stores takes memory and/or redis, --replicas 1-16, --cluster-scale 0.1-100")
    args.cluster = ClusterOptions(replicas=args.replicas, stores=stores, scale=args.cluster_scale)
    return args


def _provider(engine: str) -> EngineProvider:
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


async def _run_all(
    provider: EngineProvider, ids: list[str], options: Options, args: argparse.Namespace
) -> list[results.ScenarioResult]:
    out: list[results.ScenarioResult] = []
    try:
        if "R1" in ids and args.engine != "sim":
            from bench.scenarios import real_s1
            from engines import layout

            for name in args.layouts.split(","):
                workloads = [real_s1.WORKLOADS[w] for w in args.workloads.split(",")]
                started = time.monotonic()
                produced = await real_s1.run_layout(
                    args.engine, layout.LAYOUTS[name], workloads, args.rounds, None, options.out_dir
                )
                for result in produced:
                    result.seconds = (time.monotonic() - started) / len(produced)
                out += produced
        for entry in entries_for([i for i in ids if i != "R1"]):
            produces, runner = SCENARIOS[entry]
            print(f"{'/'.join(produces)} ...", flush=True)
            started = time.monotonic()
            try:
                produced = await runner(provider, options)
            except Exception as exc:  # one broken scenario must not lose the others' results
                traceback.print_exc()
                produced = [results.ScenarioResult.unavailable(i, TITLES[i], "-", f"failed: {exc!r}") for i in produces]
            for result in produced:
                result.seconds = time.monotonic() - started
            out += [r for r in produced if r.id in ids]
    finally:
        await provider.aclose()
    return out


def _meta(
    args: argparse.Namespace, provider: EngineProvider, seconds: float, load: tuple[float, ...], commit: str
) -> dict[str, Any]:
    return {
        "command": _command(),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "host": f"{os.cpu_count()} CPUs, load average {load[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end",
        "python": platform.python_version(),
        "commit": commit,
        "engine": args.engine,
        "engine_description": provider.describe(),
        "seconds": seconds,
    }


def _command() -> str:
    return " ".join(["python -m bench", *sys.argv[1:]])


def _record(
    args: argparse.Namespace,
    loaded: list[results.ScenarioResult],
    meta: dict[str, Any],
    load_before: tuple[float, ...],
    started_at: datetime.datetime,
) -> Path:
    """The run's record in bench/results/records/ (what docs/benchmarks.md and the README render)."""
    setup = {
        "engine": args.engine,
        "engine_description": meta["engine_description"],
        "seconds": round(meta["seconds"]),
        "options": {
            "layouts": args.layouts,
            "workloads": args.workloads,
            "rounds": args.rounds,
            "replicas": args.replicas,
            "cluster_stores": args.cluster_stores,
            "cluster_scale": args.cluster_scale,
        },
    }
    record = run_records.to_json(
        loaded,
        command=meta["command"],
        machine_info=run_records.machine(load_before, os.getloadavg()),
        setup=setup,
        when=started_at,
        commit_id=meta["commit"],
    )
    return run_records.write(record)


def _keep_figure(loaded: list[results.ScenarioResult], out_dir: Path, engine: str) -> None:
    """Copy S1's time-to-first-token plot into bench/figures/ (tracked), where docs/benchmarks.md shows it."""
    plot = out_dir / FIGURE
    if engine == "sim" and any(r.id == "S1" and r.available for r in loaded) and plot.is_file():
        FIGURES.mkdir(exist_ok=True)
        shutil.copyfile(plot, FIGURES / FIGURE)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.from_json:
        loaded, meta = results.load(args.from_json)
        out_dir = args.from_json.parent
    else:
        provider = _provider(args.engine)
        out_dir = args.out or ROOT / "bench" / "results" / ("" if args.engine == "sim" else args.engine)
        out_dir.mkdir(parents=True, exist_ok=True)
        ids = [s.strip().upper() for s in args.scenarios.split(",")] if args.scenarios else []
        ids = ids or [i for entry in DEFAULT[args.engine] for i in SCENARIOS.get(entry, ((entry,), None))[0]]
        commit = run_records.commit()  # before the run: the code that ran, even if the tree changes meanwhile
        load, started, started_at = os.getloadavg(), time.monotonic(), datetime.datetime.now(datetime.UTC)
        loaded = asyncio.run(_run_all(provider, ids, Options(out_dir, args.profile, args.cluster), args))
        meta = _meta(args, provider, time.monotonic() - started, load, commit)
        if not args.no_plots:
            from bench import plots

            plots.draw(loaded, out_dir)
            _keep_figure(loaded, out_dir, args.engine)
        results.save(loaded, meta, out_dir / "results.json")
        (out_dir / "RESULTS.md").write_text(report.results_markdown(loaded, meta))
        print(f"\nwrote {out_dir / 'RESULTS.md'}, {out_dir / 'results.json'} and the plots")
        if not args.no_record:
            print(f"recorded the run in {_record(args, loaded, meta, load, started_at).relative_to(ROOT)}")
        print()
    for result in loaded:
        print(report.scenario_markdown(result))
    if args.check:
        text, failed = check.evaluate(loaded)
        print(text)
        return 1 if failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One `python -m bench` run: the selected scenarios in turn, then what the run leaves behind.

Every scenario runs through the same door (`Scenario.run`), is timed, and a scenario that fails is reported
"not available" with why, without losing the others' results. Then the run writes results.json,
RESULTS.md and the plots under its output folder, and its record into bench/results/records/.
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

from bench import registry, report, results, run_records
from bench.engines import EngineProvider
from bench.scenario import Options

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "bench" / "figures"
FIGURE = "s1_ttft.png"  # the one plot the docs show


def run_and_write(
    provider: EngineProvider, ids: list[str], options: Options, args: argparse.Namespace
) -> list[results.ScenarioResult]:
    """Run the scenarios `ids` names (all of the engine's when empty) and write the run's files and record."""
    out_dir = options.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    ids = ids or registry.defaults(options.engine)
    commit = run_records.commit()  # before the run: the code that ran, even if the tree changes meanwhile
    load, started, started_at = os.getloadavg(), time.monotonic(), datetime.datetime.now(datetime.UTC)
    loaded = asyncio.run(run_all(provider, ids, options))
    meta = _meta(options.engine, provider, time.monotonic() - started, load, commit)
    if not args.no_plots:
        draw_plots(loaded, out_dir)
        _keep_figure(loaded, out_dir, options.engine)
    results.save(loaded, meta, out_dir / "results.json")
    (out_dir / "RESULTS.md").write_text(report.results_markdown(loaded, meta))
    print(f"\nwrote {out_dir / 'RESULTS.md'}, {out_dir / 'results.json'} and the plots")
    if not args.no_record:
        print(f"recorded the run in {_record(args, loaded, meta, load, started_at).relative_to(ROOT)}")
    print()
    return loaded


async def run_all(provider: EngineProvider, ids: list[str], options: Options) -> list[results.ScenarioResult]:
    """Each selected scenario in registry order; the results whose ids were asked for (S1's entry also
    measures S2: asked for S2 alone, S1's result is left out)."""
    out: list[results.ScenarioResult] = []
    try:
        for scenario in registry.select(ids):
            print(f"{'/'.join(scenario.produces)} ...", flush=True)
            started = time.monotonic()
            try:
                produced = await scenario.run(provider, options)
            except Exception as exc:  # one broken scenario must not lose the others' results
                traceback.print_exc()
                produced = [
                    results.ScenarioResult.unavailable(i, scenario.title(i), "-", f"failed: {exc!r}")
                    for i in scenario.produces
                ]
            for result in produced:
                result.seconds = result.seconds or time.monotonic() - started  # R1 times each layout itself
            out += [r for r in produced if r.id.split()[0] in ids]
    finally:
        await provider.aclose()
    return out


def draw_plots(loaded: list[results.ScenarioResult], out_dir: Path) -> None:
    """Each result's plots (its scenario's `plots`), drawn from its series; listed on the result."""
    from bench import plots  # matplotlib only when plots are drawn

    for result in loaded:
        scenario = registry.scenario_of(result.id)
        if scenario is not None and result.available and result.series:
            result.plots = [plots.draw(plot, result.series, out_dir) for plot in scenario.plots]


def _meta(
    engine: str, provider: EngineProvider, seconds: float, load: tuple[float, ...], commit: str
) -> dict[str, Any]:
    return {
        "command": " ".join(["python -m bench", *sys.argv[1:]]),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "host": f"{os.cpu_count()} CPUs, load average {load[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end",
        "python": platform.python_version(),
        "commit": commit,
        "engine": engine,
        "engine_description": provider.describe(),
        "seconds": seconds,
    }


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

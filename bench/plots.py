"""PNG plots where a picture says more than the tables: one panel per run, runs side by side.

- S1 / S5: time to first token of each request against when that first token came (the flood or batch in
  grey, the latecomers or interactive users in colour), and the engine's queue and batch over time with
  the scheduler's gate target drawn in;
- S3 / S4: output tokens served per user over time, the measuring window shaded.

Plots read only the JSON-ready `series` of each result, so `python -m bench.plots results.json` redraws
them from a saved run.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from bench.results import ScenarioResult, load

COLOURS = ["tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown"]
MARKERS = ["o", "^", "s", "D", "v", "P"]
GREY = "0.6"


def _panels(n: int, title: str, *, sharey: bool = True, height: float = 3.4) -> tuple[Figure, list[Axes]]:
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, height * rows), sharey=sharey, squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, flat[:n]


def _save(fig: Figure, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


def ttft_over_time(runs: dict[str, Any], background: str, title: str, path: Path) -> str:
    """TTFT per request against when its first token came; `background` is the tag drawn in grey (flood, batch)."""
    fig, axes = _panels(len(runs), title, sharey=True)
    for ax, (label, run) in zip(axes, runs.items(), strict=True):
        records = run["records"]  # [sent, ttft, user, tag]
        bg = [r for r in records if r[3] == background]
        if bg:
            ax.scatter([r[0] + r[1] for r in bg], [r[1] for r in bg], s=6, color=GREY, label=background)
        users = sorted({r[2] for r in records if r[3] != background})
        for i, user in enumerate(users):
            mine = [r for r in records if r[2] == user and r[3] != background]
            ax.scatter(
                [r[0] + r[1] for r in mine],
                [r[1] for r in mine],
                s=45,
                color=COLOURS[i % len(COLOURS)],
                marker=MARKERS[i % len(MARKERS)],
                label=user,
                zorder=3,
                alpha=0.8,
            )
        ax.set_yscale("log")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("first token at (s)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("time to first token (s)")
    axes[0].legend(fontsize=7, loc="upper left")
    return _save(fig, path)


def engine_over_time(runs: dict[str, Any], gate_target: float | None, title: str, path: Path) -> str:
    """The engine's waiting queue and running batch, sampled from its /metrics, with the gate target."""
    fig, axes = _panels(len(runs), title)
    for ax, (label, run) in zip(axes, runs.items(), strict=True):
        samples = run["engine"]
        if samples:
            t, waiting, running = zip(*samples, strict=True)
            ax.plot(t, running, color="tab:blue", label="running (batch)")
            ax.plot(t, waiting, color="tab:orange", label="waiting (queue)")
        if gate_target is not None and label.startswith("scheduler"):
            ax.axhline(gate_target, color="tab:red", linestyle="--", linewidth=1, label=f"gate target {gate_target:g}")
        ax.set_ylim(bottom=0)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[0].set_ylabel("requests in the engine")
    return _save(fig, path)


def tokens_over_time(series: dict[str, Any], title: str, path: Path) -> str:
    """Cumulative output tokens per user; the measuring window shaded."""
    runs = series["runs"]
    step = series["step"]
    fig, axes = _panels(len(runs), title)
    for ax, (label, per_user) in zip(axes, runs.items(), strict=True):
        start, end = series["windows"][label]
        for i, (user, cumulative) in enumerate(sorted(per_user.items())):
            ax.plot([step * k for k in range(len(cumulative))], cumulative, color=COLOURS[i % len(COLOURS)], label=user)
        ax.axvspan(start, end, color="0.9", zorder=0)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("output tokens served (cumulative)")
    return _save(fig, path)


def draw(results: list[ScenarioResult], out_dir: Path) -> None:
    """Draw every plot the results have data for and list the files on each result."""
    for result in results:
        if not result.available or not result.series:
            continue
        series = result.series
        if result.id == "S1":
            result.plots = [
                ttft_over_time(
                    series["runs"],
                    "flood",
                    "S1: time to first token, flood (grey) vs latecomers",
                    out_dir / "s1_ttft.png",
                ),
                engine_over_time(
                    series["runs"],
                    series.get("gate_target"),
                    "S1: engine queue and batch during the flood",
                    out_dir / "s1_engine.png",
                ),
            ]
        elif result.id == "C1":
            result.plots = [
                ttft_over_time(
                    series["runs"],
                    "flood",
                    "C1: time to first token across replicas, flood (grey) vs latecomers",
                    out_dir / "c1_ttft.png",
                )
            ]
        elif result.id == "CB":
            result.plots = [
                engine_over_time(
                    series["runs"],
                    series.get("gate_target"),
                    "CB: the engine's queue and batch, flood spread over the replicas",
                    out_dir / "cb_engine.png",
                )
            ]
        elif result.id in ("S3", "S4", "C3", "C4"):
            name = {
                "S3": "weights 1:2:4",
                "S4": "1000-token vs 50-token answers",
                "C3": "weights 1:2:4 across replicas",
                "C4": "long vs short answers across replicas",
            }[result.id]
            path = out_dir / f"{result.id.lower()}_tokens.png"
            result.plots = [tokens_over_time(series, f"{result.id}: output tokens per user, {name}", path)]
        elif result.id == "S5":
            result.plots = [
                ttft_over_time(
                    series["runs"],
                    "batch",
                    "S5: time to first token, batch (grey) vs interactive",
                    out_dir / "s5_ttft.png",
                ),
                engine_over_time(series["runs"], None, "S5: engine queue and batch", out_dir / "s5_engine.png"),
            ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a results.json written by python -m bench")
    args = parser.parse_args()
    results, _ = load(args.results)
    draw(results, args.results.parent)
    for result in results:
        for plot in result.plots:
            print(args.results.parent / plot)


if __name__ == "__main__":
    main()

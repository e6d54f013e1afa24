"""PNG plots where a picture says more than the tables: one panel per run, runs side by side.

Each scenario names its plots (`Scenario.plots`, `bench.scenario.Plot`), of three kinds:
- time to first token of each request against when that first token came (the flood or batch in grey, the
  latecomers or interactive users in colour: S1, S5, C1);
- the engine's queue and batch over time, with the scheduler's gate target drawn in (S1, S5, CB);
- output tokens served per user over time, the measuring window shaded (S3, S4, C3, C4).

Plots read only the JSON-ready `series` of each result, so `python -m bench --from-json results.json`
redraws them from a saved run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from bench.scenario import Plot

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


def _label(ax: Axes, title: str, xlabel: str, legend: Literal["upper left", "upper right"] | None = None) -> None:
    """A panel's title (the run), its x axis, a light grid and, where asked, the legend."""
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    if legend is not None:
        ax.legend(fontsize=7, loc=legend)


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
        _label(ax, label, "first token at (s)")
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
        _label(ax, label, "time (s)", legend="upper right")
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
        _label(ax, label, "time (s)", legend="upper left")
    axes[0].set_ylabel("output tokens served (cumulative)")
    return _save(fig, path)


def draw(plot: Plot, series: dict[str, Any], out_dir: Path) -> str:
    """Draw one of a scenario's plots from its result's series into `out_dir`; returns the file's name."""
    path = out_dir / plot.file
    if plot.kind == "ttft":
        return ttft_over_time(series["runs"], plot.background, plot.title, path)
    if plot.kind == "engine":
        return engine_over_time(series["runs"], series.get("gate_target"), plot.title, path)
    return tokens_over_time(series, plot.title, path)

"""R1's targets, per layout: on a GPU host the scheduler within 10% of the oracle (p90 25%) and the flood as
fast as FIFO's; a starved front end within 1.5x; all shared at least 10x better than FIFO's; and with
engine priorities off, within the S1 bound; and a user's minimal config (model and a priority vLLM, all else
the defaults) within 10% of what configs/example.toml gets in the same rounds."""

from __future__ import annotations

from typing import Any

from bench.results import ScenarioResult, Target
from bench.scenarios.common import divide
from bench.scenarios.r1.setups import Setup
from engines.layout import Layout


def targets(result: ScenarioResult, lay: Layout, setups: list[Setup], agg: dict[str, dict[str, Any]]) -> None:
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
                    divide(fifo.get("median"), a["median"]),
                    10.0,
                    8.0,
                    True,
                    "x",
                ),
            ]
    if {"first_minimal", "first_example"} <= keys:
        result.targets.append(
            Target(
                "latecomer TTFT median, minimal config ÷ configs/example.toml",
                "<= 1.1x",
                next(s.label for s in setups if s.key == "first_minimal"),
                divide(agg["first_minimal"]["median"], agg["first_example"]["median"]),
                1.1,
                1.5,
                False,
                "x",
            )
        )
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

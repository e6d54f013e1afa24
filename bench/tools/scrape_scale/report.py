"""The scrape tool's report: the parse alone, every way's whole scrape, the ways side by side within each
round, and the target (a hundred engines at the shipped interval in at most 10% of a core)."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from typing import Any

from bench.product import BackendConfig
from bench.tools.scrape_scale.measuring import (
    AT_ONCE,
    BEFORE,
    CLIENT_BEFORE,
    PARSE_BEFORE,
    SHIPPED,
    VARIANTS,
    Variant,
    Window,
)
from bench.tools.scrape_scale.texts import text_read

TARGET_SHARE = 0.10  # of one core, for a hundred engines at the shipped interval
TARGET_KINDS = ("vllm", "llamacpp", "tgi")  # how the adapters read the engines as shipped (vllm selects)


def shipped(field: str, schema: Any) -> Any:
    """A config field's documented default, from the schema itself."""
    return next(f.default for f in dataclasses.fields(schema) if f.name == field)


def report(
    windows: list[Window], costs: dict[str, dict[str, float]], texts: dict[str, str], args: argparse.Namespace
) -> bool:
    """Print the tables; True when the shipped design meets the target for every kind."""
    kinds = list(dict.fromkeys(w.kind for w in windows))
    print(
        f"\n{args.engines} engines per kind, each read every {args.interval} s (the shipped "
        f"scrape_interval_seconds: {shipped('scrape_interval_seconds', BackendConfig)}), event loop {args.loop}, "
        f"{args.rounds} rounds of {args.seconds} s; median [worst] over rounds\n"
    )
    print("parse alone (us of CPU per parse of the text the adapter reads):")
    for kind in kinds:
        old, new = costs[kind]["prometheus-client"], costs[kind]["scan"]
        size = len(text_read(kind, texts).encode()) / 1000
        print(
            f"  {kind:10s} {size:5.1f} KB  prometheus-client {old:7.1f}  scan {new:6.1f}  scan/before {new / old:.2f}x"
        )
    print("\nwhole scrape in the running scheduler (HTTP GET + parse + BackendLoad + monitor, all CPU / scrapes):")
    header = f"  {'kind':10s} {'way':26s} {'us/scrape':>16s} {'share of a core':>18s} {'scrapes/s':>9s}"
    print(header + f" {'loop lag p99':>12s} {'worst':>8s}")
    for kind in kinds:
        for variant in VARIANTS:
            rows = [w for w in windows if w.kind == kind and w.variant == variant]
            if not rows:
                continue
            cost = [w.cpu_per_scrape_us for w in rows]
            share = [w.share_at_interval for w in rows]
            failing = max(w.failing_engines for w in rows)
            print(
                f"  {kind:10s} {variant.label:26s} {statistics.median(cost):6.0f} [{max(cost):6.0f}]"
                f"   {100 * statistics.median(share):5.1f}% [{100 * max(share):5.1f}%]"
                f" {statistics.median(w.scrapes_per_second for w in rows):9.0f}"
                f" {statistics.median(w.lag_p99_ms for w in rows):9.1f} ms {max(w.lag_max_ms for w in rows):5.1f} ms"
                + (f"  ({failing} engines failing!)" if failing else "")
            )
    print("\nside by side, ratios within each round (median [worst] over rounds):")
    for kind in kinds:
        by_round = _by_round(windows, kind)
        parts = [
            f"{other.label.removeprefix('shipped, ')} {_ratio(by_round, other)}"
            for other in (PARSE_BEFORE, CLIENT_BEFORE, AT_ONCE)
        ]
        lag = [r[AT_ONCE].lag_p99_ms / max(r[SHIPPED].lag_p99_ms, 1e-3) for r in by_round]
        print(
            f"  {kind:10s} CPU per scrape, shipped / before {_ratio(by_round, BEFORE)}; shipped / "
            + "; ".join(parts)
            + f"; loop lag p99, one beat for all / shipped {statistics.median(lag):.1f}x [{min(lag):.1f}x]"
        )
    worst = {
        kind: max(w.share_at_interval for w in windows if w.kind == kind and w.variant == SHIPPED) for kind in kinds
    }
    counted = [kind for kind in kinds if kind in TARGET_KINDS]
    met = all(worst[kind] <= TARGET_SHARE for kind in counted)
    print(
        f"\ntarget: {args.engines} engines at {args.interval} s take at most {TARGET_SHARE:.0%} of a core, each "
        f"adapter reading its engine as shipped ({', '.join(counted)}): {'met' if met else 'MISSED'}; worst window: "
        + ", ".join(f"{kind} {100 * share:.1f}%" for kind, share in worst.items())
    )
    if "vllm_whole" in worst:
        print("  (vllm_whole is the fallback for a vLLM that does not select: 55 KB a scrape, not counted)")
    return met


def _ratio(by_round: list[dict[Variant, Window]], other: Variant) -> str:
    ratios = [r[SHIPPED].cpu_per_scrape_us / r[other].cpu_per_scrape_us for r in by_round]
    return f"{statistics.median(ratios):.2f}x [{max(ratios):.2f}x]"


def _by_round(windows: list[Window], kind: str) -> list[dict[Variant, Window]]:
    rows = [w for w in windows if w.kind == kind]
    per = len(VARIANTS)
    return [{w.variant: w for w in rows[i : i + per]} for i in range(0, len(rows), per)]

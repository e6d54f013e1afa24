"""S1 at a glance (`make demo`): a flood from one user, then two latecomers, straight to the engine and through
llm-scheduler, side by side in about a minute.

Runs S1's own workload (`bench.scenarios.s1`) twice against a fresh simulated vLLM engine (continuous
batching, FIFO queue): once with every client talking to the engine directly, once through the scheduler
(round robin). Prints each latecomer's time to first token, the idle-engine TTFT for reference, and the
engine's output tokens/s over the same window of the flood, so the ratios come from one run on one machine.
`python -m bench --scenarios S1` is the full scenario: every fairness policy, both doors, a record.

    python -m bench.tools.demo [--flood 200] [--tokens 200] [--max-num-seqs 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from bench.engines import SimProfile, SimProvider
from bench.runner import Mode, run_modes
from bench.scenarios import s1

DIRECT = "direct"
SCHEDULED = "scheduled"


async def _runs(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    profile = SimProfile(args.max_num_seqs, args.decode_base_ms, args.decode_per_seq_ms)
    p = s1.S1Params(
        flood=args.flood,
        tokens_min=args.tokens,
        tokens_max=args.tokens,
        latecomer_tokens=args.tokens,
        latecomer_delay=args.latecomer_delay,
        window_start=args.latecomer_delay,  # the throughput window opens as the latecomers arrive
        window=args.window,
    )
    modes = [Mode(DIRECT), Mode(SCHEDULED, config=s1.config("round_robin"))]
    runs, skipped = await run_modes(SimProvider(profile), modes, lambda run: s1.body(run, p), timeout=p.timeout + 60)
    if skipped:
        raise SystemExit(f"a run failed: {skipped}")
    return runs


def _print(direct: dict[str, Any], scheduled: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"\nS1: user A floods {args.flood} x {args.tokens}-token requests; B and C send one each "
        f"{args.latecomer_delay:g}s later. Engine: simulated vLLM, {args.max_num_seqs} slots, FIFO.\n"
    )
    print(f"| {'figure':<32} | {'direct':>9} | {'scheduled':>9} | {'direct/scheduled':>16} |")
    print(f"|{'-' * 34}|{'-' * 11}|{'-' * 11}|{'-' * 18}|")
    print(f"| {'idle-engine TTFT (s)':<32} | {direct['idle_ttft']:9.3f} | {scheduled['idle_ttft']:9.3f} | {'':>16} |")
    for user in ("B", "C"):
        d, s = direct["latecomer_ttft"][user], scheduled["latecomer_ttft"][user]
        print(f"| {'latecomer ' + user + ' TTFT (s)':<32} | {d:9.3f} | {s:9.3f} | {d / s:15.1f}x |")
    d, s = direct["tokens_per_second"], scheduled["tokens_per_second"]
    print(f"| {'engine output tokens/s (flood)':<32} | {d:9.0f} | {s:9.0f} | {d / s:16.2f} |")
    decode = direct["request_decode_seconds"] or 0.0
    bound = 2 * direct["idle_ttft"] + decode
    worst = max(scheduled["latecomer_ttft"].values())
    print(
        f"\nTarget (S1, docs/benchmarks.md): scheduled latecomer TTFT <= 2 x idle TTFT + one request's decode time "
        f"= {bound:.2f}s -> worst {worst:.2f}s: {'met' if worst <= bound else 'NOT met'}; "
        f"engine throughput scheduled/direct = {s / d:.1%} (S2 target >= 95%)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flood", type=int, default=200, help="requests user A sends at once")
    parser.add_argument("--tokens", type=int, default=200, help="output tokens per request")
    parser.add_argument("--max-num-seqs", type=int, default=16, help="engine batch slots")
    parser.add_argument("--decode-base-ms", type=float, default=3.0)
    parser.add_argument("--decode-per-seq-ms", type=float, default=0.25)
    parser.add_argument("--latecomer-delay", type=float, default=1.0, help="seconds after the flood")
    parser.add_argument("--window", type=float, default=8.0, help="throughput window in seconds")
    parser.add_argument("--json", help="also write the raw figures to this file")
    args = parser.parse_args()
    runs = asyncio.run(_runs(args))
    _print(runs[DIRECT], runs[SCHEDULED], args)
    if args.json:
        figures = {label: {k: v for k, v in r.items() if not k.startswith("_")} for label, r in runs.items()}
        with open(args.json, "w") as f:
            json.dump({**figures, "args": vars(args)}, f, indent=2)


if __name__ == "__main__":
    main()

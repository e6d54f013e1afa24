"""S8's result: a row per setup (ratios against the baseline's), the targets against the baseline of the same
run, and the notes."""

from __future__ import annotations

from typing import Any

from bench.results import ScenarioResult, Table, Target
from bench.scenarios.common import divide, jsonable, number, ratio, seconds, share
from bench.scenarios.s8.measures import hit_rate_ratio
from bench.scenarios.s8.setups import BASELINE, DLPM, FLOODER, LOCALITY, TITLE, S8Params


def workload_text(p: S8Params) -> str:
    unit = f"{p.system_tokens} words" if p.chars_per_token <= 0 else f"{p.system_tokens} tokens"
    return (
        f"{p.users} users, each with its own system prompt ({unit}) and short questions ({p.answer_tokens}-token "
        f"answers), all backlogged: {FLOODER} floods ({p.flood_concurrency} requests outstanding), the others keep "
        f"{p.concurrency} each; {len(p.latecomer_offsets)} latecomers (new users, own system prompts) send one "
        f"request each through the window; figures over {p.window:g} s after a {p.warmup:g} s warm-up"
    )


def build_result(
    runs: dict[str, dict[str, Any]], skipped: dict[str, str], p: S8Params, engine: str, *, targets: bool
) -> ScenarioResult:
    """The table, the targets (simulator only) and the notes from the setups' figures."""
    result = ScenarioResult(
        "S8", TITLE, workload_text(p), engine, notes=[f"{k}: not available ({v})" for k, v in skipped.items()]
    )
    result.table = Table(
        [
            "run",
            "prefix-cache hit rate",
            "output tokens/s",
            "TTFT mean",
            "TTFT p99",
            "Jain's index (output tokens)",
            "largest per-user deficit",
            "latecomer median TTFT",
        ]
    )
    baseline = runs.get(BASELINE)
    for label, r in runs.items():
        deficit = f"{number(r['largest_deficit'])} tokens ({share(r['largest_deficit_share'])})"
        hit = share(r["hit_rate"])
        tps = number(r["tokens_per_second"])
        if baseline is not None and label != BASELINE:
            hit += f" ({ratio(hit_rate_ratio(r, baseline), 2)})"
            tps += f" ({ratio(divide(r['tokens_per_second'], baseline['tokens_per_second']), 2)})"
        result.table.rows.append(
            [
                label,
                hit,
                tps,
                seconds(r["ttft_mean"]),
                seconds(r["ttft_p99"]),
                number(r["jain"], 3),
                deficit,
                seconds(r["latecomer_median"]),
            ]
        )
    if targets:
        _targets(result, runs)
    result.notes += [
        "Hit rate: both engines' `vllm:prefix_cache_hits_total` ÷ `vllm:prefix_cache_queries_total` (tokens), "
        "deltas over the window; tokens/s: their `vllm:generation_tokens_total` delta over the window. In "
        "brackets: ÷ the baseline's.",
        "TTFT: the backlogged users' requests whose first token came in the window, from the client's send "
        "(scheduler queue wait included: with every user backlogged it is mostly the wait for the user's turn).",
        f"Jain's index over the {p.users} backlogged users' output tokens in the window (every request has the "
        "same shape, so output tokens and VTC cost rank users alike); the largest deficit is the least served "
        "user's shortfall from the equal share, in output tokens (and as a share of it).",
        f"D-LPM's deficit_bound = {p.deficit_bound:g}: one request's VTC charge here (prompt {p.system_tokens}"
        f" + {p.question_tokens} + 2 x {p.answer_tokens} answer tokens). VTC keeps backlogged users within "
        "about one charge of each other, so this bound offers D-LPM nearly every backlogged user at each "
        "opening (enough choice to find one whose prompt the opening engine holds) while a user falls at most "
        "one more request behind than under VTC alone.",
        "Both locality setups leave `locality.index_max_bytes` at its default: each backend's index holds as many "
        "64-character blocks as its engine's cache, read from the engine's `vllm:cache_config_info` "
        f"(here {p.prefix_cache_blocks} blocks of 16 tokens, {p.prefix_cache_blocks * 16 * 4 // 64} index blocks). "
        "A fixed index larger than the cache (a fixed 4 MiB, 26,000 blocks) remembers every prompt it ever "
        "sent each backend, so every user matches on both and its turns follow a belief the engine's LRU has "
        "already evicted.",
        f"Latecomers: {len(p.latecomer_offsets)} new users at {', '.join(f'{o:g}' for o in p.latecomer_offsets)} s "
        "into the window, one request each with its own system prompt (cached nowhere).",
    ]
    result.raw = {label: jsonable(r) for label, r in runs.items()}
    return result


def _targets(result: ScenarioResult, runs: dict[str, dict[str, Any]]) -> None:
    """Hit rate and throughput for the whole feature (D-LPM); fairness and latecomers for both locality
    setups. Each against the baseline setup of the same run."""
    baseline = runs.get(BASELINE)
    if baseline is None:
        result.notes.append("the baseline setup did not run: no ratios")
        return
    dlpm = runs.get(DLPM)
    if dlpm is not None:
        result.targets.append(
            Target(
                "prefix-cache hit rate ÷ the baseline's",
                ">= 2x least_loaded + vtc's",
                DLPM,
                hit_rate_ratio(dlpm, baseline),
                2.0,
                1.7,
                unit="x",
            )
        )
        result.targets.append(
            Target(
                "output tokens/s ÷ the baseline's",
                ">= 1.2x least_loaded + vtc's",
                DLPM,
                divide(dlpm["tokens_per_second"], baseline["tokens_per_second"]),
                1.2,
                1.1,
                unit="x",
            )
        )
    for label in (LOCALITY, DLPM):
        r = runs.get(label)
        if r is None:
            continue
        result.targets.append(Target("Jain's index of per-user output tokens", ">= 0.95", label, r["jain"], 0.95, 0.92))
        result.targets.append(
            Target(
                "latecomer median TTFT ÷ the baseline's",
                "<= 1.1x least_loaded + vtc's",
                label,
                divide(r["latecomer_median"], baseline["latecomer_median"]),
                1.1,
                1.25,
                higher_is_better=False,
                unit="x",
            )
        )

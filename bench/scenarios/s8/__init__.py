"""S8 locality: two engine replicas with prefix caches, per-user fairness kept while routing on prefixes.

Eight users each have their own ~1,000-token system prompt and ask short questions (64-token answers), all
backlogged (closed loops); one of them floods (many more requests outstanding). Two replicas of the model
each have a prefix cache holding about half of the eight system prompts, so where a request goes decides
whether its prompt's prefill is skipped. Setups, in one run on the same machine minutes apart:

- the baseline: `least_loaded` backend choice + `vtc` fairness;
- `prefix_locality` backend choice + `vtc`;
- `prefix_locality` + `vtc` + `locality.deficit_bound` (D-LPM: among users within the bound of the least
  served, the request whose prefix the open engine most likely holds goes first).

Reported per setup over a measuring window after a warm-up: the engines' own prefix-cache hit rate
(`vllm:prefix_cache_hits_total` ÷ `vllm:prefix_cache_queries_total`, deltas over the window, both
replicas), engine output tokens/s, TTFT mean and p99 of the backlogged users' requests (client side, queue
wait included), Jain's index of the eight users' output tokens in the window and the largest per-user
deficit (how far the least served user fell below the equal share), and S1-style latecomers: new users,
each with its own system prompt, sending one request each at fixed times through the window; their median
TTFT. On the simulator prefill costs `prefill_per_token_ms` per uncached prompt token, so a cache hit
shows in throughput as on a GPU with long prompts.

`--engine vllm` runs the same workload on two CPU vLLM servers, each pinned to one core, their KV caches
sized to about half of the working set (`bench.scenarios.s8.replicas`); the same figures, no ratio target.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from typing import Any

from bench.configs import NotAvailable
from bench.engines import EngineProvider, SimProfile, SimProvider, VllmProvider
from bench.results import ScenarioResult
from bench.scenario import Definition, Options, Scenario
from bench.scenarios.s8.replicas import ReplicaPair, SimReplicas, VllmReplicas, vllm_specs
from bench.scenarios.s8.setups import TITLE, VLLM_PARAMS, S8Params, setup_list
from bench.scenarios.s8.summary import build_result, workload_text
from bench.scenarios.s8.workload import run_setup


def _pair(provider: EngineProvider, p: S8Params) -> ReplicaPair:
    if provider.name == "vllm":
        request_tokens = p.question_tokens + p.answer_tokens
        return VllmReplicas(
            vllm_specs(
                users=p.users, system_tokens=p.system_tokens, request_tokens=request_tokens, max_num_seqs=p.max_num_seqs
            )
        )
    base = provider.profile if isinstance(provider, SimProvider) else SimProfile()
    profile = dataclasses.replace(base, max_num_seqs=p.max_num_seqs, prefill_per_token_ms=p.prefill_per_token_ms)
    return SimReplicas(profile, p.prefix_cache_blocks)


async def run(
    provider: EngineProvider, options: Options | None = None, p: S8Params | None = None
) -> list[ScenarioResult]:
    """Every S8 setup on one replica pair (real vLLM: started once for all setups); targets on the simulator."""
    real = provider.name == "vllm"
    p = p or (VLLM_PARAMS if real else S8Params())
    if isinstance(provider, VllmProvider):
        await provider.aclose()  # its single engine would share the 2 cores with the pair
    pair = _pair(provider, p)
    runs: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    try:
        async with pair.session():
            for setup in setup_list(p):
                print(f"  {setup.label} ...", flush=True)
                try:
                    runs[setup.label] = await asyncio.wait_for(
                        run_setup(pair, setup, p), p.warmup + p.window + 3 * p.timeout
                    )
                except (RuntimeError, OSError, TimeoutError, NotAvailable) as exc:
                    skipped[setup.label] = f"failed: {exc}"
                    print(f"  {setup.label}: failed: {exc!r}", file=sys.stderr)
    except (RuntimeError, OSError) as exc:  # the real engines did not start
        return [ScenarioResult.unavailable("S8", TITLE, workload_text(p), f"engines failed: {exc}")]
    if not runs:
        why = "; ".join(f"{k}: {v}" for k, v in skipped.items())
        return [ScenarioResult.unavailable("S8", TITLE, workload_text(p), why)]
    return [build_result(runs, skipped, p, pair.describe(), targets=not real)]


_P = S8Params()
DEFINITION = Definition(
    id="S8",
    title=TITLE,
    question="Does sending a request where its prompt's prefix is cached raise the engines' hit rate and "
    "throughput while users stay fairly served?",
    workload=f"{_P.users} users, each with its own {_P.system_tokens}-token system prompt and short questions "
    f"({_P.answer_tokens}-token answers), all backlogged (one keeps {_P.flood_concurrency} requests outstanding, "
    f"the others {_P.concurrency}); {len(_P.latecomer_offsets)} latecomers (new users) send one request each "
    "through the window",
    layout=f"two replicas of one model, each a simulator with {_P.max_num_seqs} slots, a prefix cache of "
    f"{_P.prefix_cache_blocks} blocks of 16 tokens (half of the system prompts) and prefill "
    f"{_P.prefill_per_token_ms:g} ms per uncached token; under vtc: least_loaded (the baseline), prefix_locality, "
    f"and prefix_locality + locality.deficit_bound = {_P.deficit_bound:g} (D-LPM). With --engine vllm: two CPU "
    "vLLM servers, one per core, with prefix caching",
    measures=f"over {_P.window:g} s after a {_P.warmup:g} s warm-up: the engines' prefix-cache hit rate, output "
    "tokens/s, TTFT mean and p99, Jain's index of the users' output tokens, the largest per-user deficit, the "
    "latecomers' median TTFT",
    targets=(
        "D-LPM's hit rate >= 2x the baseline's",
        "D-LPM's output tokens/s >= 1.2x the baseline's (simulator)",
        "Jain's index >= 0.95 for both locality setups",
        "latecomer median <= 1.1x the baseline's for both locality setups",
    ),
    duration="about 2 minutes; --engine vllm runs it on two CPU vLLM servers",
    facts=(
        "A prefix index larger than the engine's cache believes in prompts the engine has evicted: every user "
        "then matches on both replicas and follows where its prefix went last. So the index holds, by default, "
        "as many blocks as the engine's cache (read from vllm:cache_config_info).",
        "prefix_locality alone gains little here: its load bound moves a user's turns between replicas. D-LPM, "
        "which picks among the users the fairness policy allows the request that fits the engine that opened, "
        "gains most of the hit rate.",
        "Five latecomers give a noisy median; one run in three can miss the 1.1x target by chance.",
    ),
    headline=("prefix-cache hit rate ÷ the baseline's",),
)
SCENARIO = Scenario((DEFINITION,), run, engines=("sim", "vllm"))

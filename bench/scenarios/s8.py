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
sized to about half of the working set (`s8_engines.py`); the same figures, no ratio target.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import grpc

from backends.metrics import MetricSamples
from bench import harness
from bench.clients import RunClock, ScheduledClient
from bench.configs import NotAvailable, scheduler_config, validated_toml
from bench.engines import EngineProvider, SimProfile, SimProvider, VllmProvider
from bench.records import RequestRecord, percentile
from bench.results import ScenarioResult, Table, Target
from bench.runner import SCHEDULED_MODEL
from bench.scenarios._common import divide, jsonable, number, ratio, seconds, share
from bench.scenarios.definition import Definition
from bench.scenarios.s8_engines import Replica, ReplicaPair, SimReplicas, VllmReplicas, vllm_specs
from clients import pb_grpc

TITLE = "locality across replicas"
GATE_TARGET = 3
STANDARD_CLASS = [{"name": "standard", "rank": 0}]
GENERATED = "vllm:generation_tokens_total"
QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"
FLOODER = "u0"

# Words every engine's tokenizer knows (the tiny Llama's vocabulary has each as one token), so a prompt of
# N of them is about N tokens on real vLLM; the simulator counts 4 characters a token.
_WORD_TEXT = (
    "the of and to in is it you that he was for on are with as his they be at one have this from or had by "
    "hot word but what some we can out other were all there when up use your how said an each she which do "
    "their time if will way about many then them write would like so these her long make thing see him two "
    "has look more day could go come did number sound no most people my over know water than call first who"
)
WORDS = _WORD_TEXT.split()


@dataclass(frozen=True)
class Setup:
    label: str
    backend_policy: str
    deficit_bound: float = 0.0
    index_max_bytes: int = 0  # the locality index per backend (0: the service's default)


@dataclass(frozen=True)
class S8Params:
    users: int = 8
    system_tokens: int = 1008  # 63 blocks of 16 tokens: every system prompt ends on a block boundary
    chars_per_token: int = 4  # the simulator's tokenizer; 0: count words (real vLLM's tiny model)
    answer_tokens: int = 64
    question_tokens: int = 16  # room for the question in the engine's context and KV-cache sizing
    flood_concurrency: int = 64  # the flooder's requests outstanding
    concurrency: int = 8  # every other user's (enough to stay backlogged at the scheduler)
    max_num_seqs: int = 16  # per replica
    prefill_per_token_ms: float = 0.1  # 100 ms for a 1,000-token prompt: about 4 decode steps at batch 16
    prefix_cache_blocks: int = 256  # per replica: four of the eight system prompts (4 x 63 = 252 blocks)
    warmup: float = 10.0
    window: float = 30.0
    latecomer_offsets: tuple[float, ...] = (3.0, 8.0, 13.0, 18.0, 23.0)  # seconds into the window
    timeout: float = 60.0
    seed: int = 8

    @property
    def deficit_bound(self) -> float:
        """D-LPM's bound: one request's VTC charge in this workload (prompt + 2 x answer tokens)."""
        return float(self.system_tokens + self.question_tokens + 2 * self.answer_tokens)


# Real vLLM: 4 slots per replica (as R1), prompts of 1,000 words (about 1,000 tokens), a longer window for
# a slower engine; the closed loops keep the same shape (the flooder 4x the others).
VLLM_PARAMS = S8Params(
    system_tokens=1000,
    chars_per_token=0,
    flood_concurrency=16,
    concurrency=4,
    max_num_seqs=4,
    warmup=15.0,
    window=60.0,
    latecomer_offsets=(5.0, 15.0, 25.0, 35.0, 45.0),
    timeout=180.0,
)

BASELINE = "least_loaded + vtc (baseline)"
LOCALITY = "prefix_locality + vtc"
DLPM = "prefix_locality + vtc + deficit_bound (D-LPM)"


def setups(p: S8Params) -> list[Setup]:
    return [
        Setup(BASELINE, "least_loaded"),
        Setup(LOCALITY, "prefix_locality"),
        Setup(DLPM, "prefix_locality", p.deficit_bound),
    ]


def users(p: S8Params) -> list[str]:
    return [f"u{i}" for i in range(p.users)]


def system_prompt(user: str, p: S8Params) -> str:
    """The user's own system prompt: words drawn with the user's seed, `system_tokens` long (characters / 4
    on the simulator, exactly that many characters so it ends on a block boundary; words on real vLLM)."""
    rng = random.Random(f"{p.seed}:{user}")
    if p.chars_per_token <= 0:
        return f"System prompt of {user}: " + " ".join(rng.choice(WORDS) for _ in range(p.system_tokens))
    chars = p.system_tokens * p.chars_per_token
    text = f"System prompt of {user}:"
    while len(text) < chars:
        text += " " + rng.choice(WORDS)
    return text[:chars]


def question(user: str, n: int) -> str:
    """A short question (under one 64-character block, so only the system prompt's blocks are cached)."""
    return f"\n{user} asks question {n}: what is the next step?"


def scheduler_toml(setup: Setup, replicas: Sequence[Replica], max_num_seqs: int) -> str:
    """One model, one backend per replica, the setup's backend policy (and D-LPM bound), vtc fairness."""
    config = scheduler_config(
        engine_url=replicas[0].url,
        model=SCHEDULED_MODEL,
        engine_model=replicas[0].model,
        fairness="vtc",
        classes=STANDARD_CLASS,
        waiting_target=GATE_TARGET,
        max_num_seqs=max_num_seqs,
    )
    model = config["models"][0]
    base = model["backends"][0]
    model["backends"] = [
        {**base, "name": f"engine-{i}", "url": r.url, "engine_model": r.model} for i, r in enumerate(replicas)
    ]
    model["backend_policy"] = setup.backend_policy
    locality: dict[str, Any] = {}
    if setup.deficit_bound > 0:
        locality["deficit_bound"] = setup.deficit_bound
    if setup.index_max_bytes > 0:
        locality["index_max_bytes"] = setup.index_max_bytes
    if locality:
        model["locality"] = locality
    return validated_toml(config)


# ------------------------------------------------------------------------------------------------ figures


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one gets everything."""
    squares = sum(v * v for v in values)
    return None if not values or squares == 0 else sum(values) ** 2 / (len(values) * squares)


def largest_deficit(values: Sequence[float]) -> float:
    """How far the least served fell below the equal share (the mean), in the values' unit."""
    return statistics.fmean(values) - min(values) if values else 0.0


def counter_delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def figures(
    records: Sequence[RequestRecord],
    backlogged: Sequence[str],
    window: tuple[float, float],
    before: dict[str, float],
    after: dict[str, float],
) -> dict[str, Any]:
    """One run's figures from its records and the engines' summed counters at the window's edges."""
    start, end = window
    tokens = {user: 0 for user in backlogged}
    for record in records:
        if record.user in tokens:
            tokens[record.user] += record.tokens_between(start, end)
    ttfts = [
        r.ttft
        for r in records
        if r.user in tokens and r.ttft is not None and r.first_token is not None and start <= r.first_token < end
    ]
    late = [r for r in records if r.tag == "latecomer"]
    late_ttft = [r.ttft for r in late]
    queries = counter_delta(before, after, QUERIES)
    values = list(tokens.values())
    return {
        "hit_rate": divide(counter_delta(before, after, HITS), queries),
        "tokens_per_second": counter_delta(before, after, GENERATED) / (end - start),
        "ttft_mean": statistics.fmean(ttfts) if ttfts else None,
        "ttft_p99": percentile(ttfts, 99),
        "jain": jain_index(values),
        "largest_deficit": largest_deficit(values),
        "largest_deficit_share": divide(largest_deficit(values), statistics.fmean(values) if values else None),
        "tokens": tokens,
        "latecomer_ttft": late_ttft,
        "latecomer_median": None
        if not late_ttft or None in late_ttft
        else statistics.median(cast(list[float], late_ttft)),
        "prefix_queries": queries,
        "window": [start, end],
        "errors": sorted({r.error for r in records if r.error and r.error != "cancelled"}),
    }


# ------------------------------------------------------------------------------------------------ one run


async def read_counters(session: aiohttp.ClientSession, replicas: Sequence[Replica]) -> dict[str, float]:
    """The engines' generation and prefix-cache counters, summed over the replicas (retried: a busy machine
    can delay an answer)."""
    out = {GENERATED: 0.0, QUERIES: 0.0, HITS: 0.0}
    for replica in replicas:
        for attempt in range(3):
            try:
                async with session.get(replica.url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as response:
                    samples = MetricSamples.parse(await response.text())
                break
            except (aiohttp.ClientError, TimeoutError):
                if attempt == 2:
                    raise RuntimeError(f"engine at {replica.url} did not answer /metrics") from None
        for name in out:
            out[name] += samples.total(name) or 0.0
    return out


async def run_setup(pair: ReplicaPair, setup: Setup, p: S8Params) -> dict[str, Any]:
    """One setup: the replicas, a scheduler in front of them, the closed loops, the window, the latecomers."""
    backlogged = users(p)
    prompts = {user: system_prompt(user, p) for user in backlogged}
    async with contextlib.AsyncExitStack() as stack:
        replicas = await stack.enter_async_context(pair.run())
        sched = await stack.enter_async_context(
            harness.scheduler_process(scheduler_toml(setup, replicas, pair.max_num_seqs))
        )
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(sched.target))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        clock = RunClock()
        client = ScheduledClient(pb_grpc.SchedulerServiceStub(channel), SCHEDULED_MODEL, clock, setup.label)
        records: list[RequestRecord] = []
        stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        late: list[asyncio.Task[None]] = []

        async def worker(user: str, lane: int) -> None:
            n = 0
            while not stop.is_set():
                record = RequestRecord(user=user, tag="backlog", sent=clock.now(), max_tokens=p.answer_tokens)
                records.append(record)
                await client.run(record, prompts[user] + question(user, lane * 100_000 + n))
                n += 1
                if record.error is not None:
                    return  # a failing target would make this loop spin

        async def latecomer(user: str) -> None:
            record = RequestRecord(user=user, tag="latecomer", sent=clock.now(), max_tokens=p.answer_tokens)
            records.append(record)
            await client.run(record, system_prompt(user, p) + question(user, 0))

        try:
            for lane in range(max(p.flood_concurrency, p.concurrency)):  # interleaved: nobody arrives first
                for user in backlogged:
                    if lane < (p.flood_concurrency if user == FLOODER else p.concurrency):
                        tasks.append(asyncio.create_task(worker(user, lane)))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + p.timeout
            while not any(r.first_token is not None for r in records):
                if loop.time() > deadline:
                    raise TimeoutError("no token within the timeout")
                await asyncio.sleep(0.05)  # records fill in other tasks
            await asyncio.sleep(p.warmup)  # caches, counters and batches settle
            before = await read_counters(session, replicas)
            start = clock.now()
            for i, offset in enumerate(p.latecomer_offsets):
                await asyncio.sleep(max(0.0, start + offset - clock.now()))
                late.append(asyncio.create_task(latecomer(f"late{i}")))
            await asyncio.sleep(max(0.0, start + p.window - clock.now()))
            after = await read_counters(session, replicas)
            end = clock.now()
            stop.set()
            await asyncio.wait(late, timeout=p.timeout)
        finally:
            stop.set()
            for task in tasks + late:
                task.cancel()
            await asyncio.gather(*tasks, *late, return_exceptions=True)
    out = figures(records, backlogged, (start, end), before, after)
    out["requests"] = len(records)
    return out


# ------------------------------------------------------------------------------------------------ the scenario


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


def workload(p: S8Params) -> str:
    unit = f"{p.system_tokens} words" if p.chars_per_token <= 0 else f"{p.system_tokens} tokens"
    return (
        f"{p.users} users, each with its own system prompt ({unit}) and short questions ({p.answer_tokens}-token "
        f"answers), all backlogged: {FLOODER} floods ({p.flood_concurrency} requests outstanding), the others keep "
        f"{p.concurrency} each; {len(p.latecomer_offsets)} latecomers (new users, own system prompts) send one "
        f"request each through the window; figures over {p.window:g} s after a {p.warmup:g} s warm-up"
    )


async def run(provider: EngineProvider, p: S8Params | None = None) -> list[ScenarioResult]:
    real = provider.name == "vllm"
    p = p or (VLLM_PARAMS if real else S8Params())
    if isinstance(provider, VllmProvider):
        await provider.aclose()  # its single engine would share the 2 cores with the pair
    pair = _pair(provider, p)
    runs: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    try:
        async with pair.session():
            for setup in setups(p):
                print(f"  {setup.label} ...", flush=True)
                try:
                    runs[setup.label] = await asyncio.wait_for(
                        run_setup(pair, setup, p), p.warmup + p.window + 3 * p.timeout
                    )
                except (RuntimeError, OSError, TimeoutError, NotAvailable) as exc:
                    skipped[setup.label] = f"failed: {exc}"
                    print(f"  {setup.label}: failed: {exc!r}", file=sys.stderr)
    except (RuntimeError, OSError) as exc:  # the real engines did not start
        return [ScenarioResult.unavailable("S8", TITLE, workload(p), f"engines failed: {exc}")]
    if not runs:
        why = "; ".join(f"{k}: {v}" for k, v in skipped.items())
        return [ScenarioResult.unavailable("S8", TITLE, workload(p), why)]
    return [build_result(runs, skipped, p, pair.describe(), targets=not real)]


def build_result(
    runs: dict[str, dict[str, Any]], skipped: dict[str, str], p: S8Params, engine: str, *, targets: bool
) -> ScenarioResult:
    """The table, the targets (simulator only) and the notes from the setups' figures."""
    result = ScenarioResult(
        "S8", TITLE, workload(p), engine, notes=[f"{k}: not available ({v})" for k, v in skipped.items()]
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


def hit_rate_ratio(run: dict[str, Any], baseline: dict[str, Any]) -> float | None:
    """Hit rate ÷ the baseline's (infinite when the baseline hit nothing and this hit something)."""
    if run["hit_rate"] is None or baseline["hit_rate"] is None:
        return None
    if baseline["hit_rate"] == 0:
        return float("inf") if run["hit_rate"] > 0 else None
    return float(run["hit_rate"] / baseline["hit_rate"])


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
    command="python -m bench --scenarios S8",
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

"""S9 (b): an hour of an internet-scale day in simulated time, vtc against FIFO on the same arrivals.

Users whose request rates follow a Zipf law (user k sends in proportion to 1/k: a few heavy users, a long
tail), each on one of three models (user k on model k mod 3), prompts and answers from a fixed length mix;
arrivals are one Poisson stream, the same for both setups (one seeded generator). The engines are the
simulator's model (`engine.BatchEngine`), split evenly over the models, every backend with `prefix_locality`
and the `signals` gate; the offered load is a little over what the engines serve, so queues form and the
policy decides who waits.

- vtc: the core as it ships, one queue per (model, user);
- FIFO: the same core with every call under one user, so each model has one queue served in arrival order
  (the bench still counts each call for its own user).

Measures (`measures.DayMeasures`): TTFT of light users (those outside the heaviest 1%), the heaviest user's
share of its model's output tokens against its max-min fair share of weight 1, vtc's stated service-difference
bound checked after every event for the heaviest users of each model while both of a pair are backlogged,
the share of engine steps with every slot busy while the model had work queued, and the CPU per request.
"""

from __future__ import annotations

import bisect
import itertools
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench.product import SimConfig, step_seconds
from bench.scenarios.s9.measures import DayMeasures
from bench.scenarios.s9.simulation import Call, Simulation

MODELS = ("chat", "code", "embed-rerank")
PROMPT_MIX = ((64, 0.4), (256, 0.4), (1024, 0.2))  # (tokens, share)
ANSWER_MIX = ((64, 0.4), (256, 0.4), (1024, 0.2))
CHARS_PER_TOKEN = 4  # the core's prompt estimate reads about four characters per token
FIFO_USER = "everyone"


@dataclass(frozen=True)
class DayParams:
    users: int = 10_000
    engines: int = 100
    seconds: float = 3600.0
    load: float = 1.1  # offered load over the engines' estimated capacity
    seed: int = 9
    max_num_seqs: int = 16
    decode_base_ms: float = 20.0
    decode_per_seq_ms: float = 3.0
    prefill_per_token_ms: float = 0.02
    heavy_share: float = 0.01  # the heaviest users, by rank; the others are light
    pairs_per_model: int = 6  # the heaviest users of each model whose pairwise service difference is checked

    @property
    def sim(self) -> SimConfig:
        return SimConfig(
            max_num_seqs=self.max_num_seqs,
            decode_base_ms=self.decode_base_ms,
            decode_per_seq_ms=self.decode_per_seq_ms,
            prefill_per_token_ms=self.prefill_per_token_ms,
            prefix_cache_blocks=4096,
        )

    def capacity_per_second(self) -> float:
        """Requests a second the engines serve with full batches (decode only): the load's yardstick."""
        step, _ = step_seconds(self.sim, self.max_num_seqs, 0)
        mean_answer = sum(tokens * share for tokens, share in ANSWER_MIX)
        return self.engines * self.max_num_seqs / step / mean_answer

    def rate(self) -> float:
        return self.load * self.capacity_per_second()


QUICK = DayParams(users=300, engines=6, seconds=300.0, load=1.3)


def model_of(rank: int) -> str:
    return MODELS[(rank - 1) % len(MODELS)]


def light(rank: int, p: DayParams) -> bool:
    return rank > max(1, round(p.users * p.heavy_share))


def _pick(rng: random.Random, mix: tuple[tuple[int, float], ...]) -> int:
    point, total = rng.random(), 0.0
    for tokens, share in mix:
        total += share
        if point < total:
            return tokens
    return mix[-1][0]


def arrivals(p: DayParams) -> Iterator[tuple[float, int, int, int]]:
    """(time from the start, user rank, prompt tokens, answer tokens), in time order, the same for a seed."""
    rng = random.Random(p.seed)
    cumulative = list(itertools.accumulate(1.0 / k for k in range(1, p.users + 1)))
    rate, at = p.rate(), 0.0
    while True:
        at += rng.expovariate(rate)
        if at >= p.seconds:
            return
        rank = bisect.bisect_left(cumulative, rng.random() * cumulative[-1]) + 1
        yield at, rank, _pick(rng, PROMPT_MIX), _pick(rng, ANSWER_MIX)


def prompt(rank: int, tokens: int, serial: int) -> str:
    """The user's own opening (what prefix caching finds again) and a question of its own."""
    head = f"user {rank} context. "
    tail = f" question {serial}."
    body = tokens * CHARS_PER_TOKEN - len(head) - len(tail)
    return head + "x" * max(0, body) + tail


def config(p: DayParams, fairness: str) -> dict[str, Any]:
    per_model = [p.engines // len(MODELS) + (1 if i < p.engines % len(MODELS) else 0) for i in range(len(MODELS))]
    return {
        "scheduling": {"fairness": fairness},
        "models": [
            {
                "name": model,
                "backend_policy": "prefix_locality",
                "max_queued": 10**7,
                "max_queued_per_user": 10**7,
                "max_queued_bytes": 10**12,
                "max_queued_bytes_per_user": 10**12,
                "max_tokens_limit": 4096,
                "gate": {"policy": "signals"},
                "backends": [
                    {
                        "name": f"{model}-{i}",
                        "kind": "vllm",
                        "url": f"http://{model}-{i}.sim.invalid:8000",
                        "max_num_seqs": p.max_num_seqs,
                        "scrape_interval_seconds": 0.2,
                    }
                    for i in range(count)
                ],
            }
            for model, count in zip(MODELS, per_model, strict=True)
        ],
    }


def calls(p: DayParams, start: float, fifo: bool) -> Iterator[Call]:
    for serial, (at, rank, prompt_tokens, answer_tokens) in enumerate(arrivals(p)):
        user = f"u{rank}"
        yield Call(
            start + at,
            model_of(rank),
            FIFO_USER if fifo else user,
            prompt(rank, prompt_tokens, serial),
            prompt_tokens,
            answer_tokens,
            account=user,
        )


def run_setup(p: DayParams, fifo: bool) -> dict[str, Any]:
    """One setup through the simulated hour; its figures."""
    engines = {(m["name"], b["name"]): p.sim for m in config(p, "vtc")["models"] for b in m["backends"]}
    ranks = {f"u{k}": k for k in range(1, p.users + 1)}
    checked = {
        model: [f"u{k}" for k in range(1, p.users + 1) if model_of(k) == model][: p.pairs_per_model] for model in MODELS
    }
    measures = DayMeasures(
        p.max_num_seqs, {f"u{k}" for k in ranks.values() if light(k, p)}, checked, longest=(1024, 1024)
    )
    sim = Simulation(config(p, "vtc"), engines, [measures])
    measures.attach(sim)
    started_cpu, started_wall = time.process_time(), time.monotonic()
    sim.feed(calls(p, sim.start, fifo))
    sim.run_until(sim.start + p.seconds)
    cpu, wall = time.process_time() - started_cpu, time.monotonic() - started_wall
    figures = measures.figures(sim.now(), heaviest="u1", model=model_of(1))
    figures.update(
        setup="FIFO" if fifo else "vtc",
        wall_seconds=wall,
        cpu_seconds=cpu,
        cpu_us_per_request=cpu / max(1, measures.arrived) * 1e6,
        decision_cpu_us_per_request=sim.decision_cpu_ns / max(1, measures.arrived) / 1000,
    )
    return figures

"""The simulator's prefix cache: hash chains over 16-token blocks, LRU, vLLM's counters, prefill skipped."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from backends.adapters.vllm import cache_tokens
from backends.metrics import MetricSamples
from backends.sim import SimConfig, running_simulator
from backends.sim.engine import GenerateParams, NullObserver, SimEngine
from backends.sim.prefix_cache import PrefixCache, block_hashes
from backends.sim.tokens import count_tokens
from tests.sim.support import fast_config, scrape, value

RECORDED_VLLM_METRICS = Path(__file__).resolve().parents[1] / "engines" / "data" / "vllm_metrics.txt"

BLOCK_CHARS = 64  # 16 tokens of 4 characters


def _text(seed: str, blocks: int) -> str:
    """`blocks` full blocks of distinct text, then a short tail."""
    return "".join(f"{seed}{i:04d}".ljust(BLOCK_CHARS, ".") for i in range(blocks)) + "tail"


def _lookup(cache: PrefixCache, prompt: str) -> int:
    return cache.lookup(prompt, count_tokens(prompt))


def _insert(cache: PrefixCache, prompt: str) -> None:
    cache.insert(prompt, count_tokens(prompt))


def test_a_block_matches_only_with_its_whole_prefix() -> None:
    cache = PrefixCache(capacity_blocks=100)
    _insert(cache, _text("a", 4))
    assert _lookup(cache, _text("a", 4)) == 4 * 16
    # Same second block, different first block: the chain breaks at block 0, so nothing matches.
    other = _text("b", 1) + _text("a", 4)[BLOCK_CHARS:]
    assert block_hashes(other, count_tokens(other), 16)[1] != block_hashes(_text("a", 4), 80, 16)[1]
    assert _lookup(cache, other) == 0
    # A prompt sharing the first two blocks and then diverging hits exactly those two.
    diverging = _text("a", 4)[: 2 * BLOCK_CHARS] + _text("z", 2)
    assert _lookup(cache, diverging) == 2 * 16


def test_counts_queries_and_hits_in_tokens_and_never_the_last_token() -> None:
    cache = PrefixCache(capacity_blocks=100)
    exact = "x" * (3 * BLOCK_CHARS)  # exactly 48 tokens: the last block holds the last token
    _insert(cache, exact)
    assert _lookup(cache, exact) == 2 * 16  # vLLM computes the last token again: at most 47 cached
    assert (cache.queries, cache.hits) == (48, 32)
    assert _lookup(cache, "short") == 0  # no full block
    assert (cache.queries, cache.hits) == (50, 32)


def test_least_recently_used_chains_go_first_tail_before_head() -> None:
    cache = PrefixCache(capacity_blocks=6)
    a, b = _text("a", 3), _text("b", 3)
    _insert(cache, a)
    _insert(cache, b)
    assert len(cache) == 6
    assert _lookup(cache, a) == 3 * 16  # a is now the most recent
    _insert(cache, _text("c", 2))  # evicts two of b's blocks: its tail first
    assert len(cache) == 6
    assert _lookup(cache, a) == 3 * 16
    assert _lookup(cache, b) == 1 * 16  # b's head block survived; its chain still matches there


def test_capacity_zero_is_off_and_counts_nothing() -> None:
    cache = PrefixCache(capacity_blocks=0)
    _insert(cache, _text("a", 3))
    assert _lookup(cache, _text("a", 3)) == 0
    assert (len(cache), cache.queries, cache.hits) == (0, 0, 0)


def test_negative_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="prefix_cache_blocks"):
        SimConfig(prefix_cache_blocks=-1)


class _PrefillLog(NullObserver):
    def __init__(self) -> None:
        self.prefills: list[float] = []

    def on_step(self, prefill_seconds: float | None, decode_seconds: float, batch_size: int) -> None:
        if prefill_seconds is not None:
            self.prefills.append(prefill_seconds)


async def test_a_hit_skips_that_part_of_the_prefill() -> None:
    log = _PrefillLog()
    engine = SimEngine(fast_config(prefill_per_token_ms=1.0, prefix_cache_blocks=64), log)
    engine.start()
    try:
        prompt = _text("sys", 10)  # 161 tokens, 10 full blocks
        tokens = count_tokens(prompt)
        for i in range(2):
            handle = engine.add_request(f"r{i}", GenerateParams(prompt=prompt, prompt_tokens=tokens, max_tokens=2))
            _ = [event async for event in handle]
    finally:
        await engine.aclose()
    assert log.prefills == [pytest.approx(tokens / 1000), pytest.approx((tokens - 160) / 1000)]
    assert engine.stats()["prefix_cache_hits_total"] == 160


async def test_metrics_carry_vllms_names(session: aiohttp.ClientSession) -> None:
    prompt = _text("sys", 5)
    async with running_simulator(fast_config(prefix_cache_blocks=32)) as sim:
        before = await scrape(session, sim.url)
        assert value(before, "vllm:prefix_cache_queries_total") == 0
        for _ in range(2):
            body = {"model": "sim-model", "prompt": prompt, "max_tokens": 2}
            async with session.post(sim.url + "/v1/completions", json=body) as response:
                assert response.status == 200
        after = await scrape(session, sim.url)
        async with session.get(sim.url + "/metrics") as response:
            info = MetricSamples.parse(await response.text())
    assert value(after, "vllm:prefix_cache_queries_total") == 2 * count_tokens(prompt)
    assert value(after, "vllm:prefix_cache_hits_total") == 5 * 16
    # what a router reads to size its picture of the cache: the prefix cache's blocks, as vLLM's info gauge
    assert cache_tokens(info) == 32 * 16
    assert info.labels("vllm:cache_config_info")[0]["enable_prefix_caching"] == "True"
    recorded = MetricSamples.parse(RECORDED_VLLM_METRICS.read_text()).labels("vllm:cache_config_info")
    assert set(info.labels("vllm:cache_config_info")[0]) == set(recorded[0]), "vLLM's own label names"

"""Every shipped config holds the engine's TPOT under its interactive limit and keeps the engine full.

Each config is loaded as shipped; only what ties it to a place changes: listen addresses, the backend's
URL (a simulator subprocess on a free port that steps slowly with its batch: 16 running give 200 ms per
token, 11 give 150 ms) and the backend's slot count (a fact about that engine, 16). An interactive flood
from four users goes through the scheduler; the engine's own metrics must show a mean TPOT at most 10%
above the 150 ms limit and a mean running batch, while work is queued, of at least the limit's batch
minus one (11 - 1 = 10; on a loaded machine the simulator's steps run a few ms long, and the batch whose
measured step equals the limit is used when smaller, reported beside the nominal one). Before the TPOT
gate learned the step time, the example config ran such a flood at 185 ms with 16 of 16 slots busy.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench.harness import simulator
from bench.scenarios.s5.setups import tpot_flood_config
from bench.scenarios.s5.tpot_flood import SLOW_STEPPING, SLOW_STEPPING_FLAGS, FloodStats, limit_batch, measure_flood
from scheduler_svc.app.settings import config_from_dict
from tests.helpers import client_for, example_config, run_engine_config, serving

FLOOD_REQUESTS = 32
FLOOD_TOKENS = 40  # about 6 s per request at the limit's batch: three waves, about 20 s a config
USERS = 4


def _shipped(name: str) -> dict[str, Any]:
    if name == "configs/example.toml":
        return example_config()
    if name == "make run ENGINE=vllm":
        return run_engine_config("vllm")
    if name == "bench S5 tpot flood":
        config = tpot_flood_config("http://127.0.0.1:1", "sim-model")
        config["server"]["listen"] = "127.0.0.1:0"
        return config
    raise AssertionError(name)


def _placed(raw: dict[str, Any], engine_url: str) -> dict[str, Any]:
    raw.setdefault("server", {}).update(listen="127.0.0.1:0", metrics_listen="", http_listen="", log_level="warning")
    backend = raw["models"][0]["backends"][0]
    backend.update(url=engine_url, max_num_seqs=SLOW_STEPPING["max_num_seqs"])
    return raw


async def _flood(raw: dict[str, Any]) -> tuple[FloodStats, float]:
    # the engine in its own process, as engines are: its steps do not wait for the scheduler's event loop
    async with simulator(*SLOW_STEPPING_FLAGS) as engine_url:
        config = config_from_dict(_placed(raw, engine_url))
        interactive = config.scheduling.priority_class("interactive")
        assert interactive is not None and interactive.max_tpot_seconds, "the config sets no interactive TPOT limit"
        model = config.models[0].name
        outstanding = 0
        async with serving(config) as server:
            clients = [client_for(server, user=f"user{u}") for u in range(USERS)]

            async def one(i: int) -> None:
                nonlocal outstanding
                try:
                    result = await clients[i % USERS].submit(
                        model, f"question {i}", max_tokens=FLOOD_TOKENS, ignore_eos=True, priority_class="interactive"
                    )
                    assert result.usage.completion_tokens == FLOOD_TOKENS
                finally:
                    outstanding -= 1

            async def flood() -> None:
                nonlocal outstanding
                outstanding = FLOOD_REQUESTS
                await asyncio.gather(*(one(i) for i in range(FLOOD_REQUESTS)))

            try:
                stats = await measure_flood(engine_url, flood, lambda: outstanding)
            finally:
                for client in clients:
                    await client.close()
    return stats, interactive.max_tpot_seconds


@pytest.mark.parametrize("name", ["configs/example.toml", "make run ENGINE=vllm", "bench S5 tpot flood"])
async def test_shipped_config_holds_tpot_and_keeps_the_batch(name: str) -> None:
    stats, limit = await _flood(_shipped(name))
    print(f"{name}: {stats.describe(limit)}")
    assert stats.mean_tpot is not None and stats.mean_tpot <= 1.10 * limit, stats.describe(limit)
    assert stats.queued_samples >= 30, stats.describe(limit)
    assert stats.mean_running_queued is not None
    # the limit's batch: 11 on the nominal engine, fewer if this machine's load makes its steps longer
    assert stats.limit_batch(limit) >= limit_batch(limit) - 2, f"engine too slow to judge: {stats.describe(limit)}"
    assert stats.mean_running_queued >= stats.limit_batch(limit) - 1, stats.describe(limit)

"""Request cost over real gRPC and HTTP: two models priced 1 and 10 on their own simulators, global scope."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from backends.sim import SimConfig, running_simulator
from clients import SchedulerClient
from tests.helpers import client_for, make_config, serving

FAST = SimConfig(decode_base_ms=2.0, decode_per_seq_ms=0.5, max_num_seqs=2)


def _model(name: str, url: str, price: float) -> dict[str, object]:
    return {
        "name": name,
        "input_token_cost": price,
        "output_token_cost": price,
        "gate": {"waiting_target": 1},
        "backends": [{"name": f"{name}-0", "kind": "vllm", "url": url, "engine_model": "sim-model"}],
    }


async def _loop(
    client: SchedulerClient, model: str, tokens: int, stop: asyncio.Event, enough: Callable[[], bool]
) -> None:
    while not stop.is_set():
        await client.submit(model, "hi", max_tokens=tokens, ignore_eos=True)
        if enough():
            stop.set()


async def test_two_users_backlogged_on_a_cheap_and_a_dear_model_get_equal_cost_shares() -> None:
    """Each user asks long answers on one model and short ones on the other (a: long on dear, b: long on
    cheap), four streams each per model, so both are backlogged on both throughout. The cost each is served
    is read from llmsched_user_cost_total, whose accounts come from the config only."""
    async with running_simulator(FAST) as cheap, running_simulator(FAST) as dear:
        config = make_config(
            models=[_model("cheap", cheap.url, 1.0), _model("dear", dear.url, 10.0)],
            scheduling={"fairness": "vtc", "fairness_scope": "global", "cost_accounts": {"a": "a", "b": "b"}},
        )
        async with serving(config) as server, client_for(server, "a") as a, client_for(server, "b") as b:
            async with client_for(server, "stranger-7") as stranger:
                await stranger.submit("cheap", "hi", max_tokens=4, ignore_eos=True)
            registry = server.scheduler.metrics.registry

            def cost(account: str) -> float:
                return sum(
                    registry.get_sample_value("llmsched_user_cost_total", {"model": m, "account": account}) or 0.0
                    for m in ("cheap", "dear")
                )

            def enough() -> bool:  # about 1,000 dear tokens each: a few seconds
                return min(cost("a"), cost("b")) >= 10_000

            stop = asyncio.Event()
            plan = [(a, "dear", 24), (a, "cheap", 4), (b, "dear", 4), (b, "cheap", 24)]
            loops = [asyncio.create_task(_loop(c, m, n, stop, enough)) for c, m, n in plan for _ in range(4)]
            await stop.wait()
            await asyncio.gather(*loops)
            shares = {"a": cost("a"), "b": cost("b")}
            other = cost("other")
    assert abs(shares["a"] / shares["b"] - 1) <= 0.10, shares
    assert other >= 4, "a user the config does not name counts under 'other'"
    labels = {s.labels["account"] for m in registry.collect() for s in m.samples if m.name == "llmsched_user_cost"}
    assert labels == {"a", "b", "other"}, labels

"""Engine adapters against the simulator over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest

from backends import (
    Accepted,
    BackendOverloaded,
    BackendUnavailable,
    ChatMessage,
    Finished,
    GenerationRequest,
    SamplingParams,
    TextDelta,
)
from backends.adapters.tgi import TgiBackend
from backends.adapters.vllm import VllmBackend
from backends.base import Backend, BackendSpec, GenerationEvent
from backends.sim import SimConfig, running_simulator
from backends.sim.config import Flavor
from tests.helpers import eventually

FAST = SimConfig(decode_base_ms=1.0, decode_per_seq_ms=0.2)


def req(
    rid: str = "r1",
    tokens: int = 5,
    messages: tuple[ChatMessage, ...] | None = None,
    engine_priority: int | None = None,
) -> GenerationRequest:
    return GenerationRequest(
        request_id=rid,
        prompt="Hello world" if messages is None else None,
        messages=messages,
        params=SamplingParams(max_tokens=tokens, ignore_eos=True, seed=1),
        engine_priority=engine_priority,
    )


async def collect(events: AsyncIterator[GenerationEvent]) -> tuple[str, Finished]:
    text: list[str] = []
    finished: Finished | None = None
    async for event in events:
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    return "".join(text), finished


@pytest.mark.parametrize("flavor", ["vllm", "tgi"])
async def test_streams_exactly_max_tokens_with_usage(flavor: Flavor) -> None:
    async with running_simulator(dataclasses.replace(FAST, flavor=flavor)) as sim:
        backend: Backend = (VllmBackend if flavor == "vllm" else TgiBackend)(
            BackendSpec(name="b", url=sim.url, engine_model="sim-model")
        )
        try:
            text, finished = await collect(backend.generate(req(tokens=7)))
            again, _ = await collect(backend.generate(req(rid="r2", tokens=7)))
        finally:
            await backend.aclose()
    assert finished.completion_tokens == 7 and finished.finish_reason == "length"
    assert finished.prompt_tokens and finished.prompt_tokens > 0
    assert text and text == again  # same seed, same prompt: deterministic


@pytest.mark.parametrize("flavor", ["vllm", "tgi"])
async def test_chat_messages_use_the_chat_endpoint(flavor: Flavor) -> None:
    async with running_simulator(dataclasses.replace(FAST, flavor=flavor)) as sim:
        backend = (VllmBackend if flavor == "vllm" else TgiBackend)(
            BackendSpec(name="b", url=sim.url, engine_model="sim-model")
        )
        try:
            request = GenerationRequest(
                request_id="c1",
                messages=(ChatMessage("user", "hi there"),),
                params=SamplingParams(max_tokens=4, ignore_eos=True),
            )
            text, finished = await collect(backend.generate(request))
        finally:
            await backend.aclose()
    assert text and finished.completion_tokens == 4


async def test_vllm_priority_is_sent_only_when_configured() -> None:
    async with running_simulator(dataclasses.replace(FAST, scheduling_policy="fcfs")) as sim:
        plain = VllmBackend(BackendSpec(name="b", url=sim.url, engine_model="sim-model"))
        wrong = VllmBackend(BackendSpec(name="b", url=sim.url, engine_model="sim-model", priority_scheduling=True))
        try:
            await collect(plain.generate(req("plain", engine_priority=5)))  # not configured: field left out
            # An fcfs engine accepts the field and ignores it, as vLLM 0.32 does: a misconfiguration is silent.
            await collect(wrong.generate(req("wrong", engine_priority=5)))
            assert [entry["priority"] for entry in sim.engine.stats()["served_order"]] == [0, 5]
        finally:
            await plain.aclose()
            await wrong.aclose()


async def test_vllm_load_reads_waiting_running_and_tpot_under_load() -> None:
    config = SimConfig(max_num_seqs=2, decode_base_ms=5.0, decode_per_seq_ms=1.0)
    async with running_simulator(config) as sim:
        backend = VllmBackend(BackendSpec(name="b", url=sim.url, engine_model="sim-model"))
        try:
            flood = [asyncio.create_task(collect(backend.generate(req(f"f{i}", tokens=200)))) for i in range(6)]
            await eventually(lambda: (sim.engine.stats()["running"], sim.engine.stats()["waiting"]) == (2, 4))
            first = await backend.load()
            await asyncio.sleep(0.1)  # let tokens accumulate between two scrapes: TPOT is a delta
            second = await backend.load()
            for task in flood:
                task.cancel()
            await asyncio.gather(*flood, return_exceptions=True)
        finally:
            await backend.aclose()
    assert first.ok and (first.waiting, first.running) == (4, 2)
    assert second.tpot_seconds is not None and 0.001 < second.tpot_seconds < 0.5
    assert first.cache_tokens == config.kv_cache_blocks * config.kv_block_size  # no prefix cache: the KV cache


@pytest.mark.parametrize(("flavor", "chat"), [("vllm", False), ("vllm", True), ("tgi", False), ("tgi", True)])
@pytest.mark.parametrize("events_read", [1, 2])  # closed at Accepted (the engine's answer), or at the first text
async def test_closing_the_stream_at_any_event_aborts_the_request_in_the_engine(
    flavor: Flavor, chat: bool, events_read: int
) -> None:
    async with running_simulator(SimConfig(flavor=flavor, decode_base_ms=20.0)) as sim:
        backend = (VllmBackend if flavor == "vllm" else TgiBackend)(
            BackendSpec(name="b", url=sim.url, engine_model="sim-model")
        )
        try:
            request = req(tokens=500, messages=(ChatMessage("user", "hi"),)) if chat else req(tokens=500)
            events = backend.generate(request)
            kinds = [type(await anext(events)) for _ in range(events_read)]
            assert kinds == [Accepted, TextDelta][:events_read]
            await events.aclose()
            # At once, not when the adapter is closed or the 500 tokens are done: the connection is closed.
            await eventually(lambda: sim.engine.stats()["aborted_total"] == 1, timeout=2.0, what="engine abort")
            stats = sim.engine.stats()
            assert (stats["running"], stats["completed_total"]) == (0, 0)
            assert stats["generated_tokens_total"] < 50
        finally:
            await backend.aclose()


async def test_tgi_error_inside_the_stream_is_unavailable() -> None:
    async with running_simulator(dataclasses.replace(FAST, flavor="tgi")) as sim:
        sim.faults.update({"stream_error_after_tokens": 2})
        backend = TgiBackend(BackendSpec(name="b", url=sim.url, engine_model="sim-model"))
        seen: list[TextDelta] = []
        try:
            with pytest.raises(BackendUnavailable, match="reported"):
                async for event in backend.generate(req(tokens=10)):
                    if isinstance(event, TextDelta):
                        seen.append(event)
        finally:
            await backend.aclose()
    assert sum(e.tokens for e in seen) == 2  # tokens that arrive together come as one delta


async def test_tgi_over_its_concurrency_cap_is_overloaded() -> None:
    async with running_simulator(SimConfig(flavor="tgi", max_concurrent_requests=1, decode_base_ms=20.0)) as sim:
        backend = TgiBackend(BackendSpec(name="b", url=sim.url, engine_model="sim-model"))
        try:
            first = backend.generate(req("a", tokens=100))
            await anext(first)
            with pytest.raises(BackendOverloaded):
                await collect(backend.generate(req("b", tokens=3)))
            await first.aclose()
        finally:
            await backend.aclose()


@pytest.mark.parametrize("fault", [{"stream_cut_after_tokens": 3}, {"reject_all_with_status": 503}])
async def test_engine_failures_are_unavailable(fault: dict[str, int]) -> None:
    async with running_simulator(FAST) as sim:
        sim.faults.update(fault)
        backend = VllmBackend(BackendSpec(name="b", url=sim.url, engine_model="sim-model"))
        try:
            with pytest.raises(BackendUnavailable):
                await collect(backend.generate(req(tokens=10)))
        finally:
            await backend.aclose()


async def test_unreachable_engine_is_unavailable_and_its_load_not_ok() -> None:
    async with running_simulator(FAST) as sim:
        url = sim.url
    backend = VllmBackend(BackendSpec(name="b", url=url, engine_model="sim-model"))  # nothing listens there any more
    try:
        with pytest.raises(BackendUnavailable, match="cannot reach"):
            await collect(backend.generate(req()))
        load = await backend.load()
    finally:
        await backend.aclose()
    assert not load.ok and load.error


async def test_metrics_down_gives_a_failed_reading() -> None:
    async with running_simulator(FAST) as sim:
        backend = VllmBackend(BackendSpec(name="b", url=sim.url, engine_model="sim-model"))
        try:
            assert (await backend.load()).ok
            sim.faults.update({"metrics_down": True})
            load = await backend.load()
        finally:
            await backend.aclose()
    assert not load.ok and "503" in (load.error or "")

"""The engine core without HTTP: batching, queue order, preemption, aborts, determinism, idling."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from backends.sim.engine import (
    Aborted,
    EngineObserver,
    FinishReason,
    GenerateParams,
    NullObserver,
    RequestHandle,
    SimEngine,
    SimRequest,
    TokenEvent,
)
from backends.sim.tokens import count_tokens
from tests.helpers import eventually
from tests.sim.support import fast_config

EngineFactory = Callable[..., SimEngine]


@pytest.fixture
async def make_engine() -> AsyncIterator[EngineFactory]:
    """Build started engines; all are closed after the test."""
    engines: list[SimEngine] = []

    def build(observer: EngineObserver | None = None, **overrides: Any) -> SimEngine:
        engine = SimEngine(fast_config(**overrides), observer)
        engine.start()
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        await engine.aclose()


def params(prompt: str = "hello", max_tokens: int = 4, **kw: Any) -> GenerateParams:
    return GenerateParams(prompt=prompt, prompt_tokens=count_tokens(prompt), max_tokens=max_tokens, **kw)


async def collect(handle: RequestHandle) -> list[TokenEvent | Aborted]:
    return [event async for event in handle]


async def test_batch_never_exceeds_max_num_seqs_and_queue_fills(make_engine: EngineFactory) -> None:
    engine = make_engine(max_num_seqs=3)
    handles = [engine.add_request(f"r{i}", params(max_tokens=5)) for i in range(10)]
    results = await asyncio.gather(*(collect(h) for h in handles))
    stats = engine.stats()
    assert stats["max_running_seen"] == 3
    assert stats["max_waiting_seen"] >= 7
    assert stats["completed_total"] == 10
    for events in results:
        assert [e.index for e in events if isinstance(e, TokenEvent)] == [1, 2, 3, 4, 5]


async def test_fcfs_serves_in_arrival_order_and_ignores_priority(make_engine: EngineFactory) -> None:
    engine = make_engine(max_num_seqs=1)
    handles = [engine.add_request(f"r{i}", params(max_tokens=2, priority=p)) for i, p in enumerate([3, 0, -5, 1])]
    await asyncio.gather(*(collect(h) for h in handles))
    assert [s["request_id"] for s in engine.stats()["served_order"]] == ["r0", "r1", "r2", "r3"]


async def test_priority_serves_lower_value_first_then_arrival(make_engine: EngineFactory) -> None:
    engine = make_engine(max_num_seqs=1, scheduling_policy="priority")
    blocker = engine.add_request("blocker", params(max_tokens=30))
    await eventually(lambda: engine.num_running == 1, what="blocker running")
    priorities = {"a": 5, "b": -1, "c": 3, "d": -1, "e": 0}
    handles = [engine.add_request(rid, params(max_tokens=2, priority=p)) for rid, p in priorities.items()]
    await asyncio.gather(collect(blocker), *(collect(h) for h in handles))
    order = [(s["request_id"], s["priority"]) for s in engine.stats()["served_order"]]
    assert order == [("blocker", 0), ("b", -1), ("d", -1), ("e", 0), ("c", 3), ("a", 5)]


async def test_waiting_high_priority_does_not_preempt_a_full_batch(make_engine: EngineFactory) -> None:
    engine = make_engine(max_num_seqs=1, scheduling_policy="priority")
    low = engine.add_request("low", params(max_tokens=20, priority=10))
    await eventually(lambda: engine.num_running == 1, what="low running")
    high = engine.add_request("high", params(max_tokens=2, priority=-10))
    low_events, _ = await asyncio.gather(collect(low), collect(high))
    assert len(low_events) == 20
    assert engine.stats()["preemptions_total"] == 0


async def test_kv_pressure_preempts_the_lowest_priority_and_output_is_unchanged(make_engine: EngineFactory) -> None:
    # 4 blocks of 16 tokens; two requests of 16 prompt tokens growing to 50 tokens cannot both fit.
    prompt_a, prompt_b = "a" * 64, "b" * 64
    solo = make_engine(max_model_len=64, kv_cache_tokens=64, scheduling_policy="priority")
    solo_a = [
        e.token for e in await collect(solo.add_request("a", params(prompt_a, 34, seed=1))) if isinstance(e, TokenEvent)
    ]
    solo_b = [
        e.token for e in await collect(solo.add_request("b", params(prompt_b, 34, seed=2))) if isinstance(e, TokenEvent)
    ]

    preempted: list[str] = []

    class Recorder(NullObserver):
        def on_preempted(self, request: SimRequest) -> None:
            preempted.append(request.request_id)

    engine = make_engine(Recorder(), max_model_len=64, kv_cache_tokens=64, scheduling_policy="priority")
    a = engine.add_request("a", params(prompt_a, 34, seed=1, priority=0))
    b = engine.add_request("b", params(prompt_b, 34, seed=2, priority=1))
    events_a, events_b = await asyncio.gather(collect(a), collect(b))
    assert engine.stats()["preemptions_total"] >= 1
    assert set(preempted) == {"b"}  # the larger (priority, arrival) goes
    assert [e.token for e in events_a if isinstance(e, TokenEvent)] == solo_a
    assert [e.token for e in events_b if isinstance(e, TokenEvent)] == solo_b


async def test_abort_removes_waiting_and_running_requests_at_once(make_engine: EngineFactory) -> None:
    engine = make_engine(max_num_seqs=1)
    running = engine.add_request("running", params(max_tokens=1000))
    waiting = engine.add_request("waiting", params(max_tokens=1000))
    await eventually(lambda: engine.num_running == 1 and engine.num_waiting == 1, what="one running, one waiting")
    assert waiting.abort("test")
    assert engine.num_waiting == 0
    assert running.abort("test")
    assert engine.num_running == 0
    assert not running.abort("again")
    assert engine.stats()["aborted_total"] == 2
    last = (await collect(waiting))[-1]
    assert isinstance(last, Aborted) and last.reason == "test"


async def test_same_seed_same_tokens_and_other_seed_differs(make_engine: EngineFactory) -> None:
    engine = make_engine()

    async def text(seed: int | None, prompt: str = "tell me") -> str:
        events = await collect(engine.add_request("r", params(prompt, 12, seed=seed)))
        return "".join(e.token.text for e in events if isinstance(e, TokenEvent))

    assert await text(7) == await text(7)
    assert await text(7) != await text(8)
    assert await text(None) == await text(None)  # no seed: a hash of the prompt decides
    assert await text(None, "tell me") != await text(None, "tell you")


async def test_eos_ends_early_unless_ignored(make_engine: EngineFactory) -> None:
    engine = make_engine(eos_probability=0.3)
    with_eos = await collect(engine.add_request("r", params(max_tokens=200, seed=3)))
    last = with_eos[-1]
    assert isinstance(last, TokenEvent) and last.finished is not None
    assert last.finished.reason is FinishReason.EOS and last.token.special
    assert len(with_eos) < 200
    ignored = await collect(engine.add_request("r", params(max_tokens=200, seed=3, ignore_eos=True)))
    assert len(ignored) == 200


async def test_step_time_follows_the_formula() -> None:
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        await asyncio.sleep(0)

    config = fast_config(decode_base_ms=10, decode_per_seq_ms=2, prefill_per_token_ms=0.5)
    engine = SimEngine(config, sleep=fake_sleep)
    engine.start()
    try:
        first = engine.add_request("a", params("x" * 400, max_tokens=3))  # 100 prompt tokens
        await collect(first)
        assert slept == pytest.approx([(10 + 2 + 0.5 * 100) / 1000, 0.012, 0.012])
        slept.clear()
        handles = [engine.add_request(f"b{i}", params("y" * 8, max_tokens=2)) for i in range(3)]  # 2 tokens each
        await asyncio.gather(*(collect(h) for h in handles))
        assert slept == pytest.approx([(10 + 2 * 3 + 0.5 * 6) / 1000, (10 + 2 * 3) / 1000])
    finally:
        await engine.aclose()


async def test_idle_engine_sleeps_without_stepping(make_engine: EngineFactory) -> None:
    engine = make_engine()
    await collect(engine.add_request("r", params(max_tokens=3)))
    steps = engine.stats()["steps_total"]
    await asyncio.sleep(0.1)  # an observation window, not synchronisation
    assert engine.stats()["steps_total"] == steps
    await collect(engine.add_request("r2", params(max_tokens=2)))  # and it wakes up again
    assert engine.stats()["steps_total"] == steps + 2


async def test_random_workload_keeps_invariants() -> None:
    """Seeded random arrivals, priorities and aborts; checked after every step."""
    rng = random.Random(1234)
    max_seqs = 4
    violations: list[str] = []

    class Checker(NullObserver):
        def on_step(self, prefill_seconds: float | None, decode_seconds: float, batch_size: int) -> None:
            if not 1 <= batch_size <= max_seqs:
                violations.append(f"batch of {batch_size}")
            if engine.num_running > max_seqs:
                violations.append(f"{engine.num_running} running")

    async def instant(_: float) -> None:
        await asyncio.sleep(0)

    config = fast_config(max_num_seqs=max_seqs, scheduling_policy="priority", max_model_len=256, kv_cache_tokens=320)
    engine = SimEngine(config, Checker(), sleep=instant)
    engine.start()
    handles: list[RequestHandle] = []
    try:
        for i in range(120):
            prompt = "p" * rng.randint(1, 400)
            handle = engine.add_request(f"r{i}", params(prompt, rng.randint(1, 40), priority=rng.randint(-2, 2)))
            handles.append(handle)
            if rng.random() < 0.2:
                rng.choice(handles).abort("random")
            for _ in range(rng.randint(0, 3)):
                await asyncio.sleep(0)
        outcomes = await asyncio.gather(*(collect(h) for h in handles))
    finally:
        await engine.aclose()
    assert violations == []
    stats = engine.stats()
    assert stats["completed_total"] + stats["aborted_total"] == len(handles)
    served = [s["request_id"] for s in stats["served_order"]]
    assert len(served) == len(set(served))  # nobody admitted twice as a new request
    for handle, events in zip(handles, outcomes, strict=True):
        terminal = [e for e in events if isinstance(e, Aborted) or e.finished is not None]
        assert len(terminal) == 1 and events[-1] is terminal[0]  # exactly one outcome, last
        tokens = [e for e in events if isinstance(e, TokenEvent)]
        assert [t.index for t in tokens] == list(range(1, len(tokens) + 1))
        if isinstance(events[-1], TokenEvent):
            assert len(tokens) == handle.request.params.max_tokens

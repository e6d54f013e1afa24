"""Submit and Stream over a real gRPC socket, against a controllable fake engine."""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from collections.abc import AsyncGenerator

import grpc
import pytest

from clients import error_reason, pb
from scheduler_svc.core.auth import Authenticator
from scheduler_svc.core.keys import key_digest
from scheduler_svc.grpc.servicer import SchedulerServicer
from tests.helpers import ControlledEngine, client_for, make_config, outcome_count, queue_depth, serving, until_settled
from tests.stream_events import event_or_end, next_event


async def test_submit_returns_text_usage_timings_and_backend() -> None:
    engine = ControlledEngine(tokens=4, auto_release=True)
    async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
        response = await client.submit("m", "Hello there", max_tokens=4, request_id="req-1", seed=7)
    assert response.text == "hello t1 t2 t3"
    assert response.request_id == "req-1"
    assert response.backend == "b0"
    assert response.finish_reason == pb.FINISH_REASON_LENGTH
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (5, 4)
    t = response.timings
    assert 0 <= t.queue_wait.ToNanoseconds() <= t.time_to_first_token.ToNanoseconds() <= t.total.ToNanoseconds()
    sent = engine.requests[0]
    assert sent.prompt == "Hello there" and sent.params.max_tokens == 4 and sent.params.seed == 7


async def test_stream_events_arrive_in_the_documented_order() -> None:
    engine = ControlledEngine(tokens=3, auto_release=True)
    async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
        kinds = [e.WhichOneof("event") async for e in client.stream("m", messages=[("user", "hi")])]
    assert kinds[0] == "queued"
    rest = [k for k in kinds if k != "queued"]
    assert rest == ["dispatched", "delta", "delta", "delta", "finished"]
    assert engine.requests[0].messages is not None and engine.requests[0].messages[0].content == "hi"


async def test_queued_updates_report_position_while_waiting() -> None:
    engine = ControlledEngine(waiting=50)  # engine reports a long queue: the gate stays closed
    config = make_config(gate={"waiting_target": 3})
    async with serving(config, engine.factory()) as server, client_for(server) as client:
        first = client.stream("m", "a", request_id="first")
        e1 = await next_event(first)
        second = client.stream("m", "b", request_id="second")
        e2 = await next_event(second)
        assert (e1.queued.position_in_user_queue, e2.queued.position_in_user_queue) == (1, 2)
        assert e2.queued.model_queue_depth == 2 and e2.queued.priority_class == "interactive"
        first.cancel()
        update = await next_event(second)  # the position changes once the first is withdrawn
        assert update.queued.position_in_user_queue == 1
        second.cancel()
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 2)
    assert engine.started == []


@pytest.mark.parametrize(
    ("kwargs", "code", "text"),
    [
        ({"model": "nope", "prompt": "x"}, grpc.StatusCode.NOT_FOUND, "unknown model 'nope'"),
        ({"model": "m", "prompt": ""}, grpc.StatusCode.INVALID_ARGUMENT, "prompt: empty"),
        ({"model": "m", "prompt": "x", "messages": [("user", "y")]}, grpc.StatusCode.INVALID_ARGUMENT, "not both"),
        ({"model": "m", "prompt": "x", "priority_class": "vip"}, grpc.StatusCode.INVALID_ARGUMENT, "priority_class"),
        ({"model": "m", "prompt": "x", "max_tokens": 0}, grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"),
        ({"model": "m", "messages": [("robot", "y")]}, grpc.StatusCode.INVALID_ARGUMENT, "role"),
    ],
)
async def test_bad_input_gets_a_clear_status_and_leaves_others_alone(
    kwargs: dict[str, object], code: grpc.StatusCode, text: str
) -> None:
    engine = ControlledEngine()
    async with (
        serving(make_config(), engine.factory()) as server,
        client_for(server, user="bob") as bob,
        client_for(server) as alice,
    ):
        running = bob.stream("m", "long job", request_id="bob-1")
        while (await next_event(running)).WhichOneof("event") != "delta":
            pass
        for call in ("submit", "stream"):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                if call == "submit":
                    await alice.submit(**kwargs)  # type: ignore[arg-type]
                else:
                    async for _ in alice.stream(**kwargs):  # type: ignore[arg-type]
                        pass
            assert err.value.code() == code
            assert text in (err.value.details() or "")
            assert error_reason(err.value)
        engine.release("bob-1")
        last = None
        while (event := await event_or_end(running)) is not None:
            last = event.WhichOneof("event")
        assert last == "finished"


async def test_missing_user_is_unauthenticated() -> None:
    engine = ControlledEngine(auto_release=True)
    async with serving(make_config(), engine.factory()) as server, client_for(server, user=None) as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.submit("m", "x")
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "x-user-id" in (err.value.details() or "")


async def test_api_keys_decide_the_user_and_cannot_be_spoofed() -> None:
    engine = ControlledEngine(waiting=50)
    config = make_config(auth={"api_key_sha256": {key_digest("sk-alice"): "alice", key_digest("sk-bob"): "bob"}})
    async with serving(config, engine.factory()) as server:
        async with client_for(server, user="bob", api_key="sk-alice") as spoofer:
            call = spoofer.stream("m", "x")
            await call.read()
            assert queue_depth(server, "alice") == 1 and queue_depth(server, "bob") == 0
            call.cancel()
        for key in ("sk-wrong", None):
            async with client_for(server, user="alice", api_key=key) as client:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await client.submit("m", "x")
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_cancel_while_queued_removes_the_request() -> None:
    engine = ControlledEngine(waiting=50)
    async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
        call = client.stream("m", "x")
        await call.read()
        assert queue_depth(server) == 1
        call.cancel()
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 1)
        assert queue_depth(server) == 0
    assert engine.started == []


async def test_cancel_while_running_aborts_the_engine_request() -> None:
    engine = ControlledEngine()
    async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
        call = client.stream("m", "x", request_id="victim")
        while (await next_event(call)).WhichOneof("event") != "delta":
            pass
        call.cancel()
        await engine.wait_for(lambda: "victim" in engine.aborted)
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 1)
        assert server.scheduler.dispatchers["m"].backends[0].estimator.in_flight == 0
    assert engine.finished == []


async def test_deadline_while_queued_is_deadline_exceeded_and_never_dispatched() -> None:
    engine = ControlledEngine(waiting=50)
    async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.submit("m", "x", timeout=0.3)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await until_settled(server, lambda: outcome_count(server, "expired") + outcome_count(server, "cancelled") == 1)
        engine.waiting = 0  # the gate opens: the expired request must still not be sent
        async with client_for(server, user="zed") as other:
            engine.auto_release = True
            await other.submit("m", "after")
    assert len(engine.started) == 1


async def test_unreadable_metrics_cap_concurrency_without_wedging() -> None:
    engine = ControlledEngine(metrics_ok=False)
    config = make_config(gate={"fallback_max_in_flight": 2})
    async with serving(config, engine.factory()) as server, client_for(server) as client:
        calls = [asyncio.create_task(client.submit("m", f"p{i}", request_id=f"r{i}")) for i in range(5)]
        await engine.wait_for(lambda: len(engine.started) == 2)
        assert engine.max_concurrent == 2
        engine.auto_release = True
        engine.release()
        results = await asyncio.gather(*calls)
    assert engine.max_concurrent == 2
    assert all(r.usage.completion_tokens == 3 for r in results)


async def test_every_admitted_request_has_exactly_one_outcome() -> None:
    engine = ControlledEngine(auto_release=True)
    async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
        await asyncio.gather(*(client.submit("m", f"p{i}") for i in range(6)))
        engine.auto_release = False  # the last one is held at the engine until its client cancels it
        call = client.stream("m", "cancel me", request_id="held")
        await call.read()
        await engine.wait_for(lambda: "held" in engine.started)
        call.cancel()
        await until_settled(
            server, lambda: outcome_count(server, "completed") + outcome_count(server, "cancelled") == 7
        )
        admitted = server.scheduler.metrics.registry.get_sample_value(
            "llmsched_requests_admitted_total", {"model": "m", "priority_class": "interactive"}
        )
    assert admitted == 7
    assert outcome_count(server, "completed") == 6
    assert engine.aborted == ["held"]


async def test_shutdown_rejects_what_is_still_queued_with_unavailable() -> None:
    engine = ControlledEngine(waiting=50)
    async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
        call = client.stream("m", "x")
        await call.read()
        stopping = asyncio.create_task(server.stop(grace=0.2))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            while await event_or_end(call) is not None:
                pass
        await stopping
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_burst_of_thousands_of_streams_all_reach_admission() -> None:
    """gRPC drops calls the Python server has not picked up yet beyond 1,000 (3,000 for certain) with a
    bare CANCELLED unless told otherwise; every call of a burst must be queued or refused by admission."""
    engine = ControlledEngine(waiting=50)  # the gate stays closed: everything stays queued
    burst = 4000
    # The burst may hold the event loop past the default staleness (a loaded machine), and a stale reading
    # lets the fallback cap's few requests go: the reading here must stay fresh for the whole burst.
    gate = {"waiting_target": 3, "stale_after_seconds": 120.0}
    async with (
        serving(make_config(gate=gate), engine.factory()) as server,
        client_for(server) as client,
    ):
        calls = [client.stream("m", "x", request_id=f"r{i}") for i in range(burst)]
        firsts = await asyncio.gather(*(next_event(call) for call in calls), return_exceptions=True)
        queued = [e for e in firsts if not isinstance(e, BaseException) and e.HasField("queued")]
        codes = Counter(e.code() for e in firsts if isinstance(e, grpc.aio.AioRpcError))
        # one user, 1,000 queued at most: admission refuses the rest, nothing is dropped before it
        assert (len(queued), codes) == (1000, Counter({grpc.StatusCode.RESOURCE_EXHAUSTED: burst - 1000}))
        for call in calls:
            call.cancel()
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 1000, timeout=60)
    assert engine.started == []


class _HandlerContext:
    """What the Stream handler reads from gRPC's context, for driving the handler directly."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-user-id", "alice"),)

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def time_remaining(self) -> None:
        return None

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: object = ()) -> None:
        raise AssertionError(f"aborted: {code} {details}")


async def test_a_stream_closed_at_a_yield_aborts_the_engine_request_at_once() -> None:
    """gRPC closes a server-streaming handler at its `yield` when the client goes away mid-stream. The
    engine request must be aborted right then, not whenever the garbage collector finds the generation
    (collection is switched off here, so a late abort would show)."""
    engine = ControlledEngine(tokens=5)  # the first token, then it waits: the request keeps running
    async with serving(make_config(), engine.factory()) as server:
        handler = SchedulerServicer(server.scheduler, Authenticator(server.config.auth))
        stream = handler.Stream(
            pb.StreamRequest(params=pb.GenerationParams(model="m", prompt="x", request_id="r1")),
            _HandlerContext(),  # type: ignore[arg-type]  # a stand-in with only what the handler reads
        )
        assert isinstance(stream, AsyncGenerator)  # aclose() below is what gRPC calls on the handler
        async for event in stream:
            if event.HasField("delta"):
                break  # the handler now sits at its `yield`
        gc.disable()
        try:
            await stream.aclose()  # what gRPC does when the client cancels
            assert engine.aborted == ["r1"]
        finally:
            gc.enable()
        assert outcome_count(server, "cancelled") == 1

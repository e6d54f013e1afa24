"""Over a real gRPC socket: request ids scoped to their user, byte limits, loop failures and health,
outcomes of calls whose deadline passes in the queue, and shutdown that tells clients to go elsewhere."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients import error_reason, from_rpc_error, pb, retry_delay
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.policies.fairness.turns import FirstInTurn, TurnView
from tests.helpers import (
    ControlledEngine,
    client_for,
    eventually,
    make_config,
    outcome_count,
    queue_depth,
    serving,
    until_settled,
)
from tests.stream_events import event_or_end, next_event


def _error_metadata(err: grpc.aio.AioRpcError) -> dict[str, str]:
    return from_rpc_error(err).metadata  # ErrorInfo's metadata


async def _drain(
    call: grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse],
) -> list[str | None]:
    """Read a stream to its end (mixing read() and iteration is not allowed); the event kinds read."""
    kinds: list[str | None] = []
    while (event := await event_or_end(call)) is not None:
        kinds.append(event.WhichOneof("event"))
    return kinds


def _internal_errors(server: SchedulerServer, component: str) -> float:
    value = server.scheduler.metrics.registry.get_sample_value(
        "llmsched_internal_errors_total", {"component": component}
    )
    return value or 0.0


async def _health(server: SchedulerServer) -> int:
    async with grpc.aio.insecure_channel(server.address) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
    return int(response.status)


async def _wait_health(server: SchedulerServer, status: int) -> None:
    """Until grpc.health.v1 says `status`: the server mirrors the core's verdict in its own task, and the
    health service offers no event to wait on."""

    async def says() -> bool:
        return await _health(server) == status

    await eventually(says, 5.0, f"health {status}")


# -- 1. request ids ------------------------------------------------------------------------------------


async def test_a_live_request_id_is_refused_for_the_same_user_and_nothing_jams() -> None:
    engine = ControlledEngine(waiting=50)  # the gate stays closed: requests stay queued
    classes = [{"name": "interactive", "rank": 0}, {"name": "batch", "rank": 1}]
    config = make_config(scheduling={"classes": classes, "default_class": "interactive"})
    async with (
        serving(config, engine.factory()) as server,
        client_for(server, user="alice") as alice,
        client_for(server, user="bob") as bob,
    ):
        first = alice.stream("m", "one", request_id="dup")
        await first.read()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await alice.submit("m", "two", request_id="dup")
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert error_reason(err.value) == "REQUEST_ID_IN_USE"
        other_user = bob.stream("m", "same id, other user", request_id="dup")  # ids are scoped to their user
        assert (await next_event(other_user)).HasField("queued")
        first.cancel()  # the jam of old: the cancelled twin left a queue entry nobody held
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 1)
        assert queue_depth(server) == 1
        engine.waiting = 0
        engine.auto_release = True
        batch = [asyncio.create_task(alice.submit("m", f"b{i}", priority_class="batch")) for i in range(5)]
        again = await alice.submit("m", "the id is free again", request_id="dup")
        assert again.request_id == "dup"
        await asyncio.gather(*batch)
        await _drain(other_user)
    assert _internal_errors(server, "dispatch") == 0
    engine_ids = [r.request_id for r in engine.requests]
    assert len(engine_ids) == len(set(engine_ids)) == 7  # the engine always sees a unique id


async def test_a_bug_during_admission_is_internal_with_error_info_and_the_service_goes_on() -> None:
    engine = ControlledEngine(auto_release=True)
    async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
        real_admit = server.scheduler.admit
        calls = 0

        def admit_once_broken(request: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise KeyError("an admission bug")
            return real_admit(request, **kwargs)

        server.scheduler.admit = admit_once_broken  # type: ignore[method-assign]
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await client.submit("m", "hello")
        assert failed.value.code() == grpc.StatusCode.INTERNAL  # not a bare UNKNOWN
        assert error_reason(failed.value) == "INTERNAL"
        assert _internal_errors(server, "admission") == 1
        answer = await client.submit("m", "hello again")  # the next call is served as usual
        assert answer.usage.completion_tokens == 3


# -- 2. unexpected errors in a dispatch loop ----------------------------------------------------------------


async def test_a_failing_band_is_counted_logged_once_and_turns_health_until_it_recovers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = ControlledEngine(auto_release=True)
    classes = [{"name": "interactive", "rank": 0}, {"name": "batch", "rank": 1}]
    config = make_config(  # round robin: its chooser is the one broken below
        scheduling={"classes": classes, "default_class": "interactive", "fairness": "round_robin"},
        server={"unhealthy_after_failed_passes": 2},
    )
    async with serving(config, engine.factory()) as server, client_for(server) as client:
        dispatcher = server.scheduler.dispatchers["m"]
        real_select = FirstInTurn.select
        broken_band = {"interactive"}

        def select(chooser: FirstInTurn, view: TurnView, eligible: Any) -> str | None:
            if next(iter(view.flows.values())).head().priority_class in broken_band:
                raise RuntimeError("a policy bug")
            return real_select(chooser, view, eligible)

        monkeypatch.setattr(FirstInTurn, "select", select)
        logged: list[str] = []
        real_report = server.scheduler.errors.report

        def spy(component: str, exc: BaseException, **context: object) -> None:
            logged.append(component)
            real_report(component, exc, **context)

        monkeypatch.setattr(server.scheduler.errors, "report", spy)
        stuck = [asyncio.create_task(client.submit("m", f"i{i}", timeout=20)) for i in range(3)]
        # the interactive band fails on the pass its first request brings (counters of another task's calls)
        await eventually(lambda: _internal_errors(server, "dispatch") >= 1, 10.0, "a failed interactive pass")
        # the batch band goes on while the interactive band fails on every pass
        done = await asyncio.gather(*(client.submit("m", f"b{i}", priority_class="batch") for i in range(3)))
        assert all(r.usage.completion_tokens == 3 for r in done)
        assert _internal_errors(server, "dispatch") >= 1
        while "dispatch:m:errors" not in server.scheduler.health.problems:  # passes merge with wake-ups
            dispatcher.decide()  # one more pass, as the next event would run: it fails again
        assert _internal_errors(server, "dispatch") >= 2
        assert not server.scheduler.health.serving
        await _wait_health(server, health_pb2.HealthCheckResponse.NOT_SERVING)
        broken_band.clear()
        dispatcher.wake()
        results = await asyncio.gather(*stuck)
        assert all(r.usage.completion_tokens == 3 for r in results)
        await _wait_health(server, health_pb2.HealthCheckResponse.SERVING)
    assert len(logged) >= 2


async def test_a_wedged_loop_turns_health_not_serving() -> None:
    engine = ControlledEngine()
    config = make_config(server={"unhealthy_after_stalled_seconds": 0.3})
    async with serving(config, engine.factory()) as server, client_for(server) as client:
        (loop,) = [t for t in asyncio.all_tasks() if t.get_name() == "dispatch:m"]
        loop.cancel()  # wedged: the model's loop never sends anything again (its task group carries on)
        call = client.stream("m", "x")
        await call.read()
        async with asyncio.timeout(5):
            while server.scheduler.health.serving:
                await server.scheduler.health.changed.wait()
        await _wait_health(server, health_pb2.HealthCheckResponse.NOT_SERVING)
        assert "dispatch:m:stall" in server.scheduler.health.problems
        call.cancel()


# -- 3. bytes -----------------------------------------------------------------------------------------------


async def test_a_prompt_over_max_prompt_bytes_is_refused_counting_utf8_bytes() -> None:
    engine = ControlledEngine(auto_release=True)
    config = make_config(models=[{"name": "m", "max_prompt_bytes": 1000, "backends": [{"name": "b0"}]}])
    async with serving(config, engine.factory()) as server, client_for(server) as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.submit("m", "é" * 600)  # 600 characters, 1,200 bytes of UTF-8
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_reason(err.value) == "PROMPT_TOO_LARGE"
        assert _error_metadata(err.value) == {"max_prompt_bytes": "1000"}
        assert "1000" in (err.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as err:  # stop strings count too
            await client.submit("m", "x" * 900, stop=["y" * 60, "z" * 60])
        assert error_reason(err.value) == "PROMPT_TOO_LARGE"
        ok = await client.submit("m", "é" * 400)
        assert ok.usage.completion_tokens == 3
    assert len(engine.started) == 1


async def test_a_prompt_larger_than_grpcs_default_limit_gets_the_services_own_answer() -> None:
    engine = ControlledEngine(auto_release=True)
    big = {"name": "big", "max_prompt_bytes": 6 << 20, "backends": [{"name": "b0"}]}
    config = make_config(models=[{"name": "m", "backends": [{"name": "b0"}]}, big])
    async with serving(config, engine.factory()) as server, client_for(server) as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.submit("m", "x" * (3_600_000))
        assert (err.value.code(), error_reason(err.value)) == (grpc.StatusCode.INVALID_ARGUMENT, "PROMPT_TOO_LARGE")
        response = await client.submit("big", "x" * (5 << 20))  # over gRPC's default 4 MiB receive limit
        assert response.usage.completion_tokens == 3
    assert len(engine.started) == 1


async def test_byte_caps_count_queued_and_running_requests_per_user_and_per_model() -> None:
    engine = ControlledEngine(tokens=2)
    model = {
        "name": "m",
        "max_queued_bytes_per_user": 3000,
        "max_queued_bytes": 5000,
        "gate": {"waiting_target": 1},
        "backends": [{"name": "b0"}],
    }
    async with (
        serving(make_config(models=[model]), engine.factory()) as server,
        client_for(server, user="alice") as alice,
        client_for(server, user="bob") as bob,
        client_for(server, user="carol") as carol,
    ):
        running = alice.stream("m", "r" * 1000)  # dispatched and held at the engine: its bytes still count
        await engine.wait_for(lambda: len(engine.started) == 1)
        engine.waiting = 50  # from here everything stays queued
        queued = alice.stream("m", "q" * 1500)
        await queued.read()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await alice.submit("m", "x" * 600)  # 1000 + 1500 + 600 > 3000
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_reason(err.value) == "QUEUE_BYTES_FULL"
        assert (retry_delay(err.value) or 0) > 0
        bob_call = bob.stream("m", "b" * 2000)  # bob has his own allowance, and 4,500 fit the model's 5,000
        assert (await next_event(bob_call)).HasField("queued")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await carol.submit("m", "c" * 600)  # 5,100 would not
        assert error_reason(err.value) == "QUEUE_BYTES_FULL"
        assert "max_queued_bytes)" in (err.value.details() or "")
        queued.cancel()  # its bytes are released with its outcome
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 1)
        small = alice.stream("m", "x" * 600)
        assert (await next_event(small)).HasField("queued")
        engine.waiting = 0
        engine.auto_release = True
        engine.release()
        for call in (running, bob_call, small):
            await _drain(call)
        dispatcher = server.scheduler.dispatchers["m"]
        await until_settled(server, lambda: dispatcher.busy == 0)
        assert server.scheduler.snapshot("m", "", 0).held_prompt_bytes == 0


async def test_a_prompt_no_byte_cap_could_ever_hold_is_refused_as_too_large_not_told_to_retry() -> None:
    engine = ControlledEngine(auto_release=True)
    model = {"name": "m", "max_queued_bytes_per_user": 3000, "max_queued_bytes": 2500, "backends": [{"name": "b0"}]}
    per_user = {"name": "u", "max_queued_bytes_per_user": 3000, "backends": [{"name": "b0"}]}
    async with (
        serving(make_config(models=[model, per_user]), engine.factory()) as server,
        client_for(server) as client,
    ):
        for name, size, limit, key in (
            ("m", 2600, 2500, "max_queued_bytes"),
            ("u", 3100, 3000, "max_queued_bytes_per_user"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.submit(name, "x" * size)  # nothing is queued: only its own size is in the way
            assert (err.value.code(), error_reason(err.value)) == (grpc.StatusCode.INVALID_ARGUMENT, "PROMPT_TOO_LARGE")
            assert _error_metadata(err.value) == {"max_prompt_bytes": str(limit)}
            assert f"at most {limit} ({key})" in (err.value.details() or "")
            assert retry_delay(err.value) is None
        assert (await client.submit("m", "x" * 2500)).usage.completion_tokens == 3  # at the cap it fits
    assert len(engine.started) == 1


# -- 6. outcomes ----------------------------------------------------------------------------------------------


async def test_calls_whose_deadline_passes_in_the_queue_are_counted_expired() -> None:
    engine = ControlledEngine(waiting=50)
    async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
        results = await asyncio.gather(
            *(client.submit("m", f"p{i}", timeout=0.2 + 0.05 * i) for i in range(7)), return_exceptions=True
        )
        assert all(
            isinstance(r, grpc.aio.AioRpcError) and r.code() == grpc.StatusCode.DEADLINE_EXCEEDED for r in results
        )
        await until_settled(server, lambda: outcome_count(server, "expired") + outcome_count(server, "cancelled") == 7)
        assert (outcome_count(server, "expired"), outcome_count(server, "cancelled")) == (7, 0)
    assert engine.started == []


# -- 8. shutdown ----------------------------------------------------------------------------------------------


async def test_shutdown_turns_queued_away_at_once_lets_running_finish_and_dispatches_nothing() -> None:
    engine = ControlledEngine(tokens=3, metrics_ok=False)  # no metrics: at most one request in flight
    config = make_config(gate={"fallback_max_in_flight": 1})
    async with serving(config, engine.factory()) as server, client_for(server) as client:
        running = client.stream("m", "running")
        await engine.wait_for(lambda: len(engine.started) == 1)
        queued = [client.stream("m", f"q{i}") for i in range(3)]
        for call in queued:
            await call.read()
        stopping = asyncio.create_task(server.stop(grace=30.0))
        for call in queued:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _drain(call)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert error_reason(err.value) == "SHUTTING_DOWN"
        assert not stopping.done()  # the queued were turned away before the grace period ended
        engine.release()  # the gate opens as it ends: still nothing may be dispatched during the drain
        events = await _drain(running)
        assert events[-1] == "finished"
        await asyncio.wait_for(stopping, 10)
    assert len(engine.started) == 1
    assert outcome_count(server, "rejected") == 3 and outcome_count(server, "completed") == 1


async def test_requests_still_running_when_the_grace_ends_are_cut_with_shutting_down() -> None:
    engine = ControlledEngine(tokens=3)
    async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
        streamed = client.stream("m", "held", request_id="streamed")
        submitted = asyncio.create_task(client.submit("m", "held too", request_id="submitted"))
        await engine.wait_for(lambda: len(engine.started) == 2)
        await server.stop(grace=0.2)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _drain(streamed)
        assert (err.value.code(), error_reason(err.value)) == (grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await submitted
        assert (err.value.code(), error_reason(err.value)) == (grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN")
    assert sorted(engine.aborted) == ["streamed", "submitted"]
    assert outcome_count(server, "failed") == 2

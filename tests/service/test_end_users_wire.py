"""End users over real sockets: gRPC's `end_user` field or `x-end-user-id` metadata and the HTTP door's OpenAI
`user` field or `x-end-user-id` header name the end user a tenant sends a request for; its siblings are not
queued behind its flood; a malformed, doubled or contradicted id is a clear refusal, one end user too many is
RESOURCE_EXHAUSTED / 429."""

from __future__ import annotations

from typing import Any

import aiohttp
import grpc
import pytest
from prometheus_client import generate_latest

from clients import pb, pb_grpc
from scheduler_svc.app.server import SchedulerServer
from tests.helpers import ControlledEngine, client_for, make_config, serving
from tests.http.support import chat, http_serving
from tests.stream_events import event_or_end

ONE_AT_A_TIME = {"fallback_max_in_flight": 1}  # no metrics from the engine: one request in flight


def _stream(channel: grpc.aio.Channel, tag: str, *metadata: tuple[str, str], end_user: str = "") -> Any:
    params = pb.GenerationParams(model="m", prompt=tag, request_id=tag, end_user=end_user)
    request = pb.StreamRequest(params=params)
    return pb_grpc.SchedulerServiceStub(channel).Stream(request, metadata=(("x-user-id", "acme"), *metadata))


async def _started_order(engine: ControlledEngine, count: int) -> list[str]:
    """Release each request as it starts, one at a time; the order the engine got them."""
    for n in range(1, count + 1):
        await engine.wait_for(lambda n=n: len(engine.started) >= n)  # type: ignore[misc]
        engine.release(engine.started[n - 1])
    return engine.started[:count]


def _stream_naming(channel: grpc.aio.Channel, tag: str, how: str | None, end_user: str) -> Any:
    """A stream whose end user is named as `how` says ("field", "metadata", or None: not named)."""
    if how == "field":
        return _stream(channel, tag, end_user=end_user)
    return _stream(channel, tag, ("x-end-user-id", end_user) if how == "metadata" else ("x-other", ""))


@pytest.mark.parametrize("how", ["field", "metadata", None])
async def test_the_field_or_metadata_names_the_end_user_and_its_sibling_passes_the_flood(how: str | None) -> None:
    engine = ControlledEngine(tokens=2, metrics_ok=False)
    config = make_config(gate=ONE_AT_A_TIME, scheduling={"fairness": "round_robin"})
    async with serving(config, engine.factory()) as server, grpc.aio.insecure_channel(server.address) as channel:
        calls = [_stream_naming(channel, "f0", how, "flood")]
        await engine.wait_for(lambda: len(engine.started) == 1)
        for i in range(1, 5):
            calls.append(_stream_naming(channel, f"f{i}", how, "flood"))
            await calls[-1].read()  # queued
        calls.append(_stream_naming(channel, "bob", how, "bob"))
        await calls[-1].read()
        order = await _started_order(engine, 6)
        for call in calls:
            await _finish(call)
    # with end users, at most one more of the flood's queued requests goes before bob's; without, all of them
    assert order.index("bob") <= 2 if how else order.index("bob") == 5, order


async def _finish(call: Any) -> Any:
    """Read a call to its end; its last message."""
    last = None
    while (message := await event_or_end(call)) is not None:
        last = message
    return last


async def _refusal(
    server: SchedulerServer, *metadata: tuple[str, str], end_user: str = ""
) -> tuple[grpc.StatusCode, str]:
    async with grpc.aio.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in _stream(channel, "x", *metadata, end_user=end_user):
                pass
    return err.value.code(), err.value.details() or ""


async def test_grpc_refuses_a_malformed_or_doubled_end_user_and_one_too_many() -> None:
    engine = ControlledEngine(tokens=2, metrics_ok=False)
    config = make_config(
        models=[
            {
                "name": "m",
                "max_end_users_per_user": 1,
                "gate": ONE_AT_A_TIME,
                "backends": [{"name": "b0", "url": "http://127.0.0.1:1", "engine_model": "sim-model"}],
            }
        ],
    )
    async with serving(config, engine.factory()) as server:
        code, details = await _refusal(server, ("x-end-user-id", "bob smith"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "x-end-user-id: invalid user id" in details
        code, details = await _refusal(server, ("x-end-user-id", "bob"), ("x-end-user-id", "eve"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "sent more than once" in details
        code, details = await _refusal(server, end_user="bob smith")
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "end_user: invalid user id" in details
        code, details = await _refusal(server, ("x-end-user-id", "bob"), end_user="eve")
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "differs from the x-end-user-id metadata" in details
        async with grpc.aio.insecure_channel(server.address) as channel:
            held = _stream(channel, "held", ("x-end-user-id", "bob"), end_user="bob")  # both, the same: one end user
            await engine.wait_for(lambda: len(engine.started) == 1)
            code, details = await _refusal(server, ("x-end-user-id", "carol"))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_end_users_per_user" in details
            async with client_for(server, user="acme") as client:  # the Python client's `end_user`
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await client.submit("m", "x", end_user="carol")
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            engine.release()
            await _finish(held)
        async with grpc.aio.insecure_channel(server.address) as channel:  # bob's request ended: carol's turn
            engine.auto_release = True
            assert (await _finish(_stream(channel, "carol", ("x-end-user-id", "carol")))).HasField("finished")


async def test_http_takes_the_openai_user_field_or_the_header_and_refuses_what_is_not_an_id() -> None:
    engine = ControlledEngine(tokens=2, auto_release=True)
    async with http_serving(engine.factory()) as (server, base), aiohttp.ClientSession() as session:

        async def post(body: dict[str, Any], **headers: str) -> tuple[int, Any]:
            sent = {"x-user-id": "acme", **headers}
            async with session.post(base + "/v1/chat/completions", json=body, headers=sent) as response:
                return response.status, await response.json()

        assert (await post(chat(user="user-42")))[0] == 200
        assert (await post(chat(), **{"x-end-user-id": "user-42"}))[0] == 200
        assert (await post(chat(user="user-42"), **{"x-end-user-id": "user-42"}))[0] == 200
        status, body = await post(chat(user="user 42"))
        assert status == 400 and body["error"]["param"] == "user" and "invalid user id" in body["error"]["message"]
        status, body = await post(chat(user="user-42"), **{"x-end-user-id": "user-43"})
        assert status == 400 and body["error"]["param"] == "user" and "differs" in body["error"]["message"]
        status, body = await post(chat(), **{"x-end-user-id": "-x"})
        assert status == 400 and body["error"]["param"] == "x-end-user-id"
        assert b"user-42" not in generate_latest(server.scheduler.metrics.registry)


async def test_queue_state_counts_the_end_users_a_user_has_queued() -> None:
    engine = ControlledEngine(tokens=2, metrics_ok=False)
    config = make_config(gate=ONE_AT_A_TIME)
    async with serving(config, engine.factory()) as server, grpc.aio.insecure_channel(server.address) as channel:
        calls = [_stream(channel, "running", end_user="ann")]
        await engine.wait_for(lambda: len(engine.started) == 1)
        for tag, end_user in (("q1", "ann"), ("q2", "ann"), ("q3", "bob"), ("q4", "")):
            calls.append(_stream(channel, tag, end_user=end_user))
            await calls[-1].read()  # queued
        async with client_for(server, user="acme") as client:
            state = await client.queue_state("m")
        (acme,) = [u for c in state.models[0].classes for u in c.users if u.user == "acme"]
        assert (acme.queued, acme.end_users) == (4, 2), "ann and bob queued; the request naming none is no end user"
        engine.auto_release = True
        engine.release()
        for call in calls:
            await _finish(call)

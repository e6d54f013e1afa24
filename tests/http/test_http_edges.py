"""The HTTP door's edges over raw HTTP on loopback: fields, sizes, identity, errors in and out of streams,
disconnects, queue updates, draining. The SDK-level behaviour is in test_openai_sdk.py."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
import pytest

from backends.base import Accepted, BackendLoad, Finished, GenerationEvent, GenerationRequest, TextDelta
from backends.errors import BackendUnavailable
from backends.fake import FakeBackend
from backends.sim import SimConfig, running_simulator
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
from tests.http.support import chat, http_serving, sse_lines

ALICE = {"x-user-id": "alice"}
CHAT = "/v1/chat/completions"


async def _post(
    session: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    async with session.post(url, json=body, headers={**ALICE, **(headers or {})}) as response:
        text = await response.text()
        return (
            response.status,
            {k.lower(): v for k, v in response.headers.items()},
            json.loads(text) if text.startswith("{") else text,
        )


def _error(body: dict[str, Any]) -> dict[str, Any]:
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    error: dict[str, Any] = body["error"]
    return error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(logprobs=True), "logprobs"),
        (chat(tools=[]), "tools"),
        ({"model": "m", "messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
        (
            chat(stream=True, stream_options={"include_usage": True, "include_obfuscation": False}),
            "stream_options.include_obfuscation",
        ),
        (chat(max_tokens="8"), "max_tokens"),
        (chat(temperature=True), "temperature"),
        (chat(temperature=10**400), "temperature"),  # an integer past any float
        (chat(frequency_penalty=-(10**400)), "frequency_penalty"),
        (chat(n=2), "n"),
        (chat(stream_options={"include_usage": True}), "stream_options"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": None}, "messages"),
    ],
)
async def test_a_field_the_door_cannot_take_is_a_400_naming_it(body: dict[str, Any], param: str) -> None:
    engine = ControlledEngine(auto_release=True)
    async with http_serving(engine.factory()) as (_, base), aiohttp.ClientSession() as session:
        status, headers, reply = await _post(session, base + CHAT, body)
    assert status == 400, reply
    error = _error(reply)
    assert error["param"] == param and error["code"] == "invalid_request" and param in error["message"]
    assert error["type"] == "invalid_request_error" and headers["x-should-retry"] == "false"
    assert engine.started == []


async def test_validation_is_the_grpc_one_and_errors_follow_the_table() -> None:
    engine = ControlledEngine(auto_release=True)
    async with http_serving(engine.factory()) as (server, base), aiohttp.ClientSession() as session:
        unknown_model = await _post(session, base + CHAT, {**chat(), "model": "nope"})
        out_of_range = await _post(session, base + CHAT, chat(temperature=11))
        bad_penalty = await _post(session, base + CHAT, chat(presence_penalty=3))
        bad_role = await _post(session, base + CHAT, {"model": "m", "messages": [{"role": "robot", "content": "x"}]})
        bad_class = await _post(session, base + CHAT, chat(), {"x-priority-class": "vip"})
        bad_meta_class = await _post(session, base + CHAT, chat(metadata={"priority_class": "vip", "team": "x"}))
        not_json = await _post(session, base + CHAT, "{")
        no_user = await _post(session, base + CHAT, chat(), {"x-user-id": "alice!"})
        rejected = server.scheduler.metrics.registry.get_sample_value(
            "llmsched_requests_rejected_total", {"model": "m", "reason": "invalid_request"}
        )
    assert unknown_model[0] == 404 and _error(unknown_model[2])["code"] == "model_not_found"
    # Range errors name their field in `param`, as type errors do.
    assert out_of_range[0] == 400 and _error(out_of_range[2])["param"] == "temperature"
    assert bad_penalty[0] == 400 and _error(bad_penalty[2])["param"] == "presence_penalty"
    assert bad_role[0] == 400 and _error(bad_role[2])["param"] == "messages[0].role"
    assert bad_class[0] == 400 and _error(bad_class[2])["param"] == "priority_class"
    assert bad_meta_class[0] == 400 and "'vip'" in _error(bad_meta_class[2])["message"]
    assert not_json[0] == 400 and _error(not_json[2])["code"] == "malformed_request"
    assert no_user[0] == 401 and _error(no_user[2])["type"] == "authentication_error"
    assert rejected == 5  # counted with the gRPC face's counter, under the configured model's name
    assert engine.started == []


async def test_bodies_and_prompts_are_bounded_with_413() -> None:
    engine = ControlledEngine(auto_release=True)
    models = [{"name": "m", "max_prompt_bytes": 100, "backends": [{"name": "b0"}]}]
    async with (
        http_serving(engine.factory(), models=models, server={"http_max_body_bytes": 4096}) as (_, base),
        aiohttp.ClientSession() as session,
    ):
        big_prompt = await _post(session, base + CHAT, chat("x" * 101))
        big_body = await _post(session, base + CHAT, chat("x" * 50, metadata={"k": "v" * 5000}))
        fits = await _post(session, base + CHAT, chat("x" * 90))
    assert big_prompt[0] == 413 and _error(big_prompt[2])["code"] == "prompt_too_large"
    assert "max_prompt_bytes" in _error(big_prompt[2])["message"]
    assert big_body[0] == 413 and "http_max_body_bytes" in _error(big_body[2])["message"]
    assert fits[0] == 200


async def test_bearer_keys_decide_identity_never_the_body_or_the_user_header() -> None:
    engine = ControlledEngine(waiting=50)  # nothing dispatches: the request stays queued where we can see it
    auth = {"api_key_sha256": {hashlib.sha256(b"alice-key").hexdigest(): "alice"}}
    async with http_serving(engine.factory(), auth=auth) as (server, base), aiohttp.ClientSession() as session:
        missing = await _post(session, base + CHAT, chat())
        wrong = await _post(session, base + CHAT, chat(), {"authorization": "Bearer nope"})
        async with session.get(base + "/v1/models") as models:
            models_status = models.status
        queued = asyncio.create_task(
            _post(
                session,
                base + CHAT,
                chat(user="mallory", safety_identifier="mallory"),
                {"authorization": "Bearer alice-key", "x-user-id": "mallory"},
            )
        )
        await eventually(lambda: queue_depth(server, "alice") == 1, what="alice's request queued")
        assert queue_depth(server, "mallory") == 0
        queued.cancel()
    assert missing[0] == 401 and wrong[0] == 401 and models_status == 401
    assert _error(wrong[2])["code"] == "unauthenticated" and missing[1]["x-should-retry"] == "false"


async def test_a_configured_trusted_header_names_the_user_without_keys() -> None:
    engine = ControlledEngine(auto_release=True)
    async with (
        http_serving(engine.factory(), server={"http_user_header": "x-forwarded-user"}) as (server, base),
        aiohttp.ClientSession() as session,
    ):
        ignored = await _post(session, base + CHAT, chat())  # x-user-id is not the configured header
        served = await _post(session, base + CHAT, chat(), {"x-forwarded-user": "bob"})
        completed = outcome_count(server, "completed")
    assert ignored[0] == 401 and served[0] == 200 and completed == 1


async def test_duplicate_live_request_id_is_409_not_retried_and_the_id_is_echoed() -> None:
    engine = ControlledEngine(waiting=50)
    async with http_serving(engine.factory()) as (server, base), aiohttp.ClientSession() as session:
        first = asyncio.create_task(_post(session, base + CHAT, chat(), {"x-request-id": "job-1"}))
        await eventually(lambda: queue_depth(server) == 1, what="first queued")
        second = await _post(session, base + CHAT, chat(), {"x-request-id": "job-1"})
        engine.waiting, engine.auto_release = 0, True
        status, headers, _ = await first
    assert second[0] == 409 and second[1]["x-should-retry"] == "false"
    assert _error(second[2])["code"] == "request_id_in_use"
    assert status == 200 and headers["x-request-id"] == "job-1"


async def test_deadline_header_ends_a_queued_request_with_504_and_no_retry() -> None:
    engine = ControlledEngine(waiting=50)
    async with http_serving(engine.factory()) as (server, base), aiohttp.ClientSession() as session:
        status, headers, body = await _post(session, base + CHAT, chat(stream=True), {"x-request-timeout-ms": "200"})
        bad = [
            await _post(session, base + CHAT, chat(), {"x-request-timeout-ms": value})
            for value in ("soon", "1_000", "1e3", "+200", "nan", "inf", "0")
        ]
        await until_settled(server, lambda: outcome_count(server, "expired") == 1)
    # a stream that failed while queued still gets its real status: the headers go out once an engine took it
    assert status == 504 and headers["x-should-retry"] == "false" and _error(body)["code"] == "queue_timeout"
    assert [(code, _error(reply)["param"]) for code, _, reply in bad] == [(400, "x-request-timeout-ms")] * len(bad)
    assert engine.started == []


async def test_queue_full_is_429_with_retry_after_from_the_grpc_hint() -> None:
    engine = ControlledEngine(waiting=50)
    models = [{"name": "m", "max_queued_per_user": 1, "backends": [{"name": "b0"}]}]
    async with http_serving(engine.factory(), models=models) as (server, base), aiohttp.ClientSession() as session:
        held = asyncio.create_task(_post(session, base + CHAT, chat()))
        await eventually(lambda: queue_depth(server) == 1, what="first queued")
        status, headers, body = await _post(session, base + CHAT, chat("again"))
        held.cancel()
    assert status == 429 and _error(body)["code"] == "queue_full" and _error(body)["type"] == "rate_limit_error"
    assert headers["retry-after"] == "1" and headers["retry-after-ms"] == "1000"  # RetryInfo's 1 s default
    assert headers["x-should-retry"] == "true"


async def test_penalties_and_the_sampling_fields_reach_the_engine() -> None:
    engine = ControlledEngine(auto_release=True)
    body = chat(presence_penalty=0.5, frequency_penalty=-0.25, seed=7, stop="END", top_p=0.9, max_completion_tokens=12)
    body["messages"] = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    async with http_serving(engine.factory()) as (_, base), aiohttp.ClientSession() as session:
        status, _, reply = await _post(session, base + CHAT, {**body, "prompt_cache_key": "session-9"})
    assert status == 200, reply
    (request,) = engine.requests
    params = request.params
    assert (params.presence_penalty, params.frequency_penalty, params.seed, params.stop) == (0.5, -0.25, 7, ("END",))
    assert params.max_tokens == 12 and params.top_p == pytest.approx(0.9)
    assert request.messages is not None and [(m.role, m.content) for m in request.messages] == [
        ("system", "be brief"),
        ("user", "a\nb"),
    ]
    assert reply["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


async def test_queue_updates_are_sse_comments_with_live_position_then_the_stream() -> None:
    engine = ControlledEngine(waiting=50, auto_release=True)
    async with http_serving(engine.factory()) as (server, base), client_for(server) as grpc_alice:
        ahead = [grpc_alice.stream("m", f"ahead {i}") for i in range(2)]  # the same user's queue, via gRPC
        for call in ahead:
            await call.read()
        lines: list[str] = []
        async with (
            aiohttp.ClientSession() as session,
            session.post(base + CHAT, json=chat(stream=True), headers={**ALICE, "x-queue-updates": "true"}) as response,
        ):
            assert response.status == 200 and response.headers["content-type"].startswith("text/event-stream")
            async for line in sse_lines(response):
                lines.append(line)
                if line.startswith(": queued position=3"):
                    ahead[0].cancel()  # one ahead leaves: position 2
                elif line.startswith(": queued position=2"):
                    ahead[1].cancel()
                elif line.startswith(": queued position=1"):
                    engine.waiting = 0  # the gate opens: dispatched, then text
    comments = [line for line in lines if line.startswith(":")]
    assert [c.split()[2] for c in comments] == ["position=3", "position=2", "position=1"], comments
    assert comments[0] == ": queued position=3 depth=3"  # nothing dispatched yet: no estimate, no eta
    assert lines.index(comments[-1]) < lines.index(next(line for line in lines if line.startswith("data: {")))
    assert lines[-1] == "data: [DONE]"


async def test_an_error_while_queued_with_updates_arrives_in_the_stream() -> None:
    engine = ControlledEngine(waiting=50)
    async with http_serving(engine.factory()) as (_, base), aiohttp.ClientSession() as session:
        headers = {**ALICE, "x-queue-updates": "true", "x-request-timeout-ms": "300"}
        async with session.post(base + CHAT, json=chat(stream=True), headers=headers) as response:
            lines = [line async for line in sse_lines(response)]
    assert response.status == 200 and lines[0].startswith(": queued position=1")
    error = _error(json.loads(lines[-1].removeprefix("data: ")))
    assert error["code"] == "queue_timeout" and "[DONE]" not in lines[-1]


def _failing_backend() -> FakeBackend:
    async def generate(request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        yield TextDelta("partial")
        raise BackendUnavailable("the engine went away", backend="b0")

    return FakeBackend(generate, lambda: BackendLoad(ok=True, read_at=time.monotonic()), name="b0")


async def test_an_error_after_dispatch_is_an_sse_error_event_and_not_retried_by_status() -> None:
    async with (
        http_serving(lambda model, backend: _failing_backend()) as (_, base),
        aiohttp.ClientSession() as session,
    ):
        async with session.post(base + CHAT, json=chat(stream=True), headers=ALICE) as response:
            lines = [line async for line in sse_lines(response)]
        status, _, whole = await _post(session, base + CHAT, chat())
    assert response.status == 200  # the headers went out when the engine took it
    payloads = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert payloads[1]["choices"][0]["delta"] == {"content": "partial"}
    assert _error(payloads[-1])["code"] == "backend_unavailable" and "data: [DONE]" not in lines
    assert status == 503 and _error(whole)["code"] == "backend_unavailable"  # not streamed: the real status


def _refusing_first(refusals: int) -> FakeBackend:
    """An engine that refuses its first `refusals` requests outright (before taking them), then answers."""
    calls: list[int] = []

    async def generate(request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        calls.append(1)
        if len(calls) <= refusals:
            raise BackendUnavailable("connection refused", backend="b0")
        yield Accepted()
        yield TextDelta("hi")
        yield Finished("stop", prompt_tokens=1, completion_tokens=1)

    return FakeBackend(generate, lambda: BackendLoad(ok=True, read_at=time.monotonic()), name="b0")


def _one_backend(failover_attempts: int) -> list[dict[str, Any]]:
    backend = {"name": "b0", "kind": "vllm", "url": "http://127.0.0.1:1", "scrape_interval_seconds": 0.05}
    failover = {"failover_attempts": failover_attempts, "failover_cooldown_seconds": 0.0}
    return [{"name": "m", "default_max_tokens": 16, "backends": [backend], **failover}]


async def test_a_stream_starts_once_an_engine_took_the_request() -> None:
    """The headers go out when an engine has taken the request, not at dispatch: one refused outright
    gets its real status, and one that got in on its failover starts its answer once (one role chunk)."""
    async with aiohttp.ClientSession() as session:
        async with http_serving(lambda model, backend: _refusing_first(1), models=_one_backend(0)) as (_, base):
            refused = await _post(session, base + CHAT, chat(stream=True))
        async with (
            http_serving(lambda model, backend: _refusing_first(1), models=_one_backend(1)) as (_, base),
            session.post(base + CHAT, json=chat(stream=True), headers=ALICE) as response,
        ):
            lines = [line async for line in sse_lines(response)]
    status, headers, body = refused
    assert status == 503 and headers["content-type"].startswith("application/json")
    assert _error(body)["code"] == "backend_unavailable"
    payloads = [json.loads(line.removeprefix("data: ")) for line in lines if line != "data: [DONE]"]
    deltas = [p["choices"][0]["delta"] for p in payloads]
    assert response.status == 200 and deltas[0] == {"role": "assistant", "content": ""}
    assert sum("role" in delta for delta in deltas) == 1 and {"content": "hi"} in deltas


async def test_disconnect_while_queued_leaves_the_queue() -> None:
    engine = ControlledEngine(waiting=50)
    async with http_serving(engine.factory()) as (server, base):
        async with aiohttp.ClientSession() as session:
            response = await session.post(
                base + CHAT, json=chat(stream=True), headers={**ALICE, "x-queue-updates": "true"}
            )
            assert (await response.content.readline()).startswith(b": queued position=1")
            response.close()  # the client goes away
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 1)
        assert queue_depth(server) == 0
        engine.waiting = 0
    assert engine.started == []


async def test_disconnect_while_running_aborts_the_request_in_the_engine() -> None:
    async with (
        running_simulator(SimConfig(decode_base_ms=10.0)) as sim,
        http_serving(backend_url=sim.url) as (server, base),
    ):
        async with aiohttp.ClientSession() as session:
            body = chat("a long story", stream=True, max_tokens=2000, ignore_eos=True)
            response = await session.post(base + CHAT, json=body, headers=ALICE)
            async for line in sse_lines(response):
                if '"content":"' in line and '"content":""' not in line:
                    break  # the engine is generating
            assert sim.engine.stats()["running"] == 1
            response.close()
        await eventually(lambda: sim.engine.stats()["aborted_total"] == 1, what="engine abort")
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 1)
    assert sim.engine.stats()["completed_total"] == 0


async def test_draining_answers_503_and_readyz_says_so() -> None:
    engine = ControlledEngine(waiting=50)
    async with http_serving(engine.factory()) as (server, base), aiohttp.ClientSession() as session:
        async with session.get(base + "/readyz") as ready, session.get(base + "/healthz") as live:
            before = (ready.status, live.status)
        queued = asyncio.create_task(_post(session, base + CHAT, chat()))
        await eventually(lambda: queue_depth(server) == 1, what="queued")
        await server.scheduler.drain(0.1)
        status, headers, body = await queued
        late = await _post(session, base + CHAT, chat())
        async with session.get(base + "/readyz") as ready, session.get(base + "/healthz") as live:
            after = (ready.status, live.status)
    assert before == (200, 200) and after == (503, 200)
    assert status == 503 and _error(body)["code"] == "shutting_down" and headers["x-should-retry"] == "true"
    assert late[0] == 503 and _error(late[2])["code"] == "shutting_down"


async def test_models_listing_and_unknown_paths() -> None:
    engine = ControlledEngine()
    async with http_serving(engine.factory()) as (_, base), aiohttp.ClientSession(headers=ALICE) as session:
        async with session.get(base + "/v1/models") as models:
            listing = await models.json()
        async with session.get(base + "/v1/embeddings") as missing:
            not_found = (missing.status, await missing.json())
    assert [m["id"] for m in listing["data"]] == ["m"] and listing["object"] == "list"
    assert not_found[0] == 404 and _error(not_found[1])["code"] == "not_found"


async def test_the_door_is_off_unless_configured() -> None:
    engine = ControlledEngine()
    async with serving(make_config(), engine.factory()) as server:
        assert server.http_port == 0 and server.http_address == ""

"""The official `openai` Python SDK against the HTTP door and the engine simulator over loopback: sync and
async clients, streamed and whole answers, usage, and the SDK's error classes with its retry rules.

The sync client blocks, so it runs in a worker thread while the server keeps the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from backends.sim import SimConfig, running_simulator
from scheduler_svc.app.server import SchedulerServer
from tests.helpers import ControlledEngine, client_for, eventually, outcome_count, queue_depth, until_settled
from tests.http.support import http_serving

FAST = SimConfig(decode_base_ms=2.0, decode_per_seq_ms=0.5)
USER = {"x-user-id": "alice"}
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a story"}]


@pytest.fixture
async def door() -> AsyncIterator[tuple[SchedulerServer, str]]:
    async with (
        running_simulator(FAST) as sim,
        http_serving(backend_url=sim.url) as (server, base),
    ):
        yield server, f"{base}/v1"


def _sync(base_url: str, **kwargs: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", default_headers=USER, **kwargs)  # type: ignore[arg-type]


def _async(base_url: str, **kwargs: object) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="unused", default_headers=USER, **kwargs)  # type: ignore[arg-type]


async def test_sync_client_whole_and_streamed_chat_with_usage(door: tuple[SchedulerServer, str]) -> None:
    server, base = door

    def talk() -> tuple[openai.types.chat.ChatCompletion, list[openai.types.chat.ChatCompletionChunk]]:
        with _sync(base) as client:
            whole = client.chat.completions.create(
                model="m", messages=ASK, max_tokens=8, extra_body={"ignore_eos": True}, seed=3
            )
            chunks = list(
                client.chat.completions.create(
                    model="m",
                    messages=ASK,
                    max_completion_tokens=6,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                )
            )
            return whole, chunks

    whole, chunks = await asyncio.to_thread(talk)
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].message.content
    assert whole.choices[0].finish_reason == "length" and whole.model == "m"
    assert whole.usage is not None and whole.usage.completion_tokens == 8 and whole.usage.prompt_tokens > 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    await until_settled(server, lambda: outcome_count(server, "completed") == 2)


async def test_async_client_completions_and_a_stream_without_usage(door: tuple[SchedulerServer, str]) -> None:
    server, base = door
    registry = server.scheduler.metrics.registry

    def generated() -> float:
        return registry.get_sample_value("llmsched_generated_tokens_total", {"model": "m", "backend": "b0"}) or 0.0

    async with _async(base) as client:
        whole = await client.completions.create(model="m", prompt="Once upon a time", max_tokens=5, temperature=0.5)
        before = generated()
        stream = await client.completions.create(
            model="m", prompt="Once", max_tokens=4, stream=True, extra_body={"ignore_eos": True}
        )
        chunks = [chunk async for chunk in stream]
        counted = generated() - before
        chat_stream = await client.chat.completions.create(model="m", messages=ASK, max_tokens=3, stream=True)
        chat_chunks = [chunk async for chunk in chat_stream]
    assert whole.object == "text_completion" and whole.choices[0].text and whole.usage is not None
    assert all(chunk.usage is None for chunk in chunks)  # not asked for: not sent (still counted)
    assert "".join(chunk.choices[0].text for chunk in chunks) and chunks[-1].choices[0].finish_reason == "length"
    assert chat_chunks[0].choices[0].delta.role == "assistant"
    assert counted == 4  # usage is counted whether or not the client asked to be sent it


async def test_rate_limit_error_carries_the_retry_hint_and_the_sdk_honours_x_should_retry() -> None:
    engine = ControlledEngine(waiting=50)  # nothing dispatches
    models = [{"name": "m", "max_queued_per_user": 1, "backends": [{"name": "b0"}]}]
    async with http_serving(engine.factory(), models=models) as (server, base), client_for(server) as grpc_alice:
        held = grpc_alice.stream("m", "first, through the gRPC door")  # the same user's queue is shared
        await held.read()
        async with _async(f"{base}/v1", max_retries=0) as client:
            with pytest.raises(openai.RateLimitError) as limited:
                await client.chat.completions.create(model="m", messages=ASK)
        held.cancel()
    error = limited.value
    assert error.status_code == 429 and error.code == "queue_full" and error.type == "rate_limit_error"
    assert error.response.headers["retry-after"] == "1" and error.response.headers["retry-after-ms"] == "1000"


@pytest.mark.parametrize(
    ("request_fields", "error_class", "code"),
    [
        ({"model": "nope"}, openai.NotFoundError, "model_not_found"),
        ({"extra_body": {"logprobs": True}}, openai.BadRequestError, "invalid_request"),
        ({"extra_headers": {"x-request-id": "bad id!"}}, openai.BadRequestError, "invalid_request"),
    ],
)
async def test_status_errors_raise_the_sdk_classes(
    door: tuple[SchedulerServer, str],
    request_fields: dict[str, object],
    error_class: type[openai.APIStatusError],
    code: str,
) -> None:
    _, base = door
    fields: dict[str, object] = {"model": "m", "messages": ASK, **request_fields}
    async with _async(base) as client:
        with pytest.raises(error_class) as raised:
            await client.chat.completions.create(**fields)  # type: ignore[call-overload]
    assert raised.value.code == code


async def test_authentication_error_and_a_good_key() -> None:
    engine = ControlledEngine(auto_release=True)
    auth = {"api_key_sha256": {hashlib.sha256(b"k-alice").hexdigest(): "alice"}}
    async with http_serving(engine.factory(), auth=auth) as (_, base):
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="wrong") as bad:
            with pytest.raises(openai.AuthenticationError):
                await bad.models.list()
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="k-alice") as good:
            models = [m.id async for m in good.models.list()]
            answer = await good.chat.completions.create(model="m", messages=ASK)
    assert models == ["m"] and answer.choices[0].message.content == "hello t1 t2"


async def test_a_conflict_and_a_queue_timeout_are_not_retried_by_the_sdk() -> None:
    """The SDK retries 409 and 5xx by default (max_retries=2); x-should-retry: false stops it."""
    engine = ControlledEngine(waiting=50)
    classes = [{"name": "interactive", "rank": 0, "queue_ttl_seconds": 0.3}]
    scheduling = {"classes": classes, "default_class": "interactive"}
    async with http_serving(engine.factory(), scheduling=scheduling) as (server, base), _async(f"{base}/v1") as client:
        with pytest.raises(openai.InternalServerError) as timed_out:
            await client.chat.completions.create(model="m", messages=ASK)
        await until_settled(server, lambda: outcome_count(server, "expired") == 1)
        first = asyncio.create_task(
            client.chat.completions.create(model="m", messages=ASK, extra_headers={"x-request-id": "one"})
        )
        await eventually(lambda: queue_depth(server) == 1, what="first queued")
        with pytest.raises(openai.ConflictError):
            await client.chat.completions.create(model="m", messages=ASK, extra_headers={"x-request-id": "one"})
        with pytest.raises(openai.InternalServerError):
            await first  # its own queue TTL
        await until_settled(server, lambda: outcome_count(server, "expired") == 2)
        rejected = server.scheduler.metrics.registry.get_sample_value(
            "llmsched_requests_rejected_total", {"model": "m", "reason": "request_id_in_use"}
        )
    assert timed_out.value.status_code == 504 and timed_out.value.code == "queue_timeout"
    assert outcome_count(server, "expired") == 2 and rejected == 1  # each sent once: no retries


async def test_an_error_inside_a_stream_raises_in_the_sdk(door: tuple[SchedulerServer, str]) -> None:
    server, base = door
    async with _async(base) as client:
        stream = await client.chat.completions.create(
            model="m", messages=ASK, max_tokens=500, stream=True, extra_body={"ignore_eos": True}
        )
        with pytest.raises(openai.APIError, match="shut down"):
            async for _ in stream:
                dispatcher = server.scheduler.dispatchers["m"]
                if dispatcher.busy:
                    dispatcher.shutdown.cut_running("the scheduler shut down before the request finished")

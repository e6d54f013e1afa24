"""Hostile input over a real socket: client strings stay out of metric labels and are quoted short and
escaped in messages and logs; bodies that do not decode get INVALID_ARGUMENT with ErrorInfo."""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import aiohttp
import grpc
import pytest
import structlog
from structlog.testing import capture_logs

from clients import error_reason, pb
from scheduler_svc.app.server import SchedulerServer
from tests.helpers import ControlledEngine, client_for, make_config, serving

SERVICE = "/llmsched.v1.SchedulerService"
HUGE = 200_000


@contextmanager
def _info_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Capture structlog events at info level (the test suite logs at warning)."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    try:
        with capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(**saved)


async def _metrics(server: SchedulerServer) -> bytes:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return await response.read()


def _assert_quoted_short(details: str) -> None:
    assert len(details) < 400, details[:400]
    assert "\x00" not in details and f"...({HUGE + 1} bytes)" in details


async def test_huge_and_nul_model_names_stay_out_of_metrics_and_are_quoted_short() -> None:
    engine = ControlledEngine(auto_release=True)
    async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
        await client.submit("m", "warm up")  # the configured model's series exist before the baseline
        before = await _metrics(server)
        with _info_logs() as logs:
            for i in range(3):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await client.submit(f"{i}\x00" + "x" * (HUGE - 1), "hello")
                assert err.value.code() == grpc.StatusCode.NOT_FOUND
                assert error_reason(err.value) == "MODEL_NOT_FOUND"
                _assert_quoted_short(err.value.details() or "")
                assert "'0\\x00xxx" in (err.value.details() or "") or i > 0
        after = await _metrics(server)
    assert b"\x00" not in after
    assert len(after) - len(before) < 2048, (len(before), len(after))
    rejected = server.scheduler.metrics.registry.get_sample_value(
        "llmsched_requests_rejected_total", {"model": "_unknown", "reason": "model_not_found"}
    )
    assert rejected == 3
    events = [e for e in logs if e["event"] == "request_rejected"]
    assert len(events) == 3
    for event in events:
        assert all(len(str(v)) < 400 and "\x00" not in str(v) for v in event.values())


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"model": "m", "messages": [("\x00" + "r" * HUGE, "hi")]}, "role"),
        ({"model": "m", "prompt": "x", "priority_class": "\x00" + "c" * HUGE}, "priority_class"),
    ],
)
async def test_huge_role_and_priority_class_are_quoted_short(fields: dict[str, Any], where: str) -> None:
    engine = ControlledEngine(auto_release=True)
    async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.submit(**fields)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details() or ""
    assert where in details
    _assert_quoted_short(details)


async def test_queue_state_for_a_huge_unknown_model_is_quoted_short() -> None:
    engine = ControlledEngine(auto_release=True)
    async with serving(make_config(), engine.factory()) as server, client_for(server) as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.queue_state("\x00" + "q" * HUGE)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    _assert_quoted_short(err.value.details() or "")


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2); payloads here stay under 128 bytes."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


# Faults in the generation parameters (SubmitRequest and StreamRequest carry them as field 1, `params`;
# GetQueueState gets them as its own top-level fields, where field 1 is `model` too).
UNDECODABLE = {
    "bad UTF-8 in model": _field(1, b"m\xff"),
    "bad UTF-8 in prompt": _field(1, b"m") + _field(2, b"caf\xc3("),  # GetQueueState has no field 2
    "truncated varint": _field(1, b"m") + b"\x20\xff\xff",  # max_tokens (field 4) cut mid-varint
    "length past the end": _field(1, b"m") + b"\x12\x7fshort",
    "garbage": bytes(range(255, 0, -7)),
}


def _body(method: str, name: str) -> bytes:
    """The undecodable body `name` as `method` receives it: inside `params` for Submit and Stream."""
    raw = UNDECODABLE[name]
    return raw if method == "GetQueueState" or name == "garbage" else _field(1, raw)


@pytest.mark.parametrize(
    ("method", "body"),
    [
        (method, body)
        for method in ("Submit", "Stream", "GetQueueState")
        for body in UNDECODABLE
        if not (method == "GetQueueState" and "prompt" in body)
    ],
)
async def test_undecodable_bodies_get_invalid_argument_with_error_info(method: str, body: str) -> None:
    engine = ControlledEngine(auto_release=True)
    metadata = (("x-user-id", "alice"),)
    async with serving(make_config(), engine.factory()) as server:
        async with grpc.aio.insecure_channel(server.address) as channel:
            path = f"{SERVICE}/{method}"
            with _info_logs() as logs, pytest.raises(grpc.aio.AioRpcError) as err:
                if method == "Stream":
                    async for _ in channel.unary_stream(path, request_serializer=None, response_deserializer=None)(
                        _body(method, body), metadata=metadata, timeout=5
                    ):
                        pass
                else:
                    await channel.unary_unary(path, request_serializer=None, response_deserializer=None)(
                        _body(method, body), metadata=metadata, timeout=5
                    )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert error_reason(err.value) == "MALFORMED_REQUEST"
        details = err.value.details() or ""
        assert details.startswith("the request body does not decode") and "Unexpected" not in details
        assert [e["method"] for e in logs if e["event"] == "request_undecodable"] == [path]
        async with client_for(server) as client:  # the service is unharmed
            assert (await client.submit("m", "still fine", timeout=5)).text


async def test_a_valid_body_sent_as_raw_bytes_still_works() -> None:
    engine = ControlledEngine(auto_release=True, tokens=2)
    body = pb.SubmitRequest(params=pb.GenerationParams(model="m", prompt="hi", max_tokens=2)).SerializeToString()
    async with serving(make_config(), engine.factory()) as server, grpc.aio.insecure_channel(server.address) as ch:
        raw = await ch.unary_unary(f"{SERVICE}/Submit", request_serializer=None, response_deserializer=None)(
            body, metadata=(("x-user-id", "a"),), timeout=5
        )
    assert pb.SubmitResponse.FromString(raw).text == "hello t1"

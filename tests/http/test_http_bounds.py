"""What the HTTP door reads and for how long (`scheduler_svc.http.intake`), and inputs that once got plain
500s: raw bytes on a socket, so headers, bodies and timing are the test's own. Each refusal is an answer of
the error table in OpenAI's shape, counted, logged on one line. The memory bound under a crowd of slow and
stalled bodies is measured in a process of its own: test_http_memory.py. The door's read timeouts are real
timers on real sockets, so their effects are timed on the wall clock here (with wide margins)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from scheduler_svc.app.logs import configure_logging
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.http.intake import ReadBudget
from tests.helpers import ControlledEngine, outcome_count, until_settled
from tests.http.support import chat, http_serving

FAST = {"http_header_timeout_seconds": 0.3, "http_body_timeout_seconds": 0.3, "http_idle_timeout_seconds": 0.4}
ALICE = "x-user-id: alice\r\n"


class Answer:
    """An HTTP answer read off a raw socket."""

    def __init__(self, raw: bytes, seconds: float) -> None:
        self.raw = raw
        self.seconds = seconds
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1]) if lines[0].startswith("HTTP/") else 0
        self.headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}

    def error(self) -> dict[str, Any]:
        body = json.loads(self.body)
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
        error: dict[str, Any] = body["error"]
        return error


async def exchange(address: str, *parts: bytes | float, timeout: float = 5.0) -> Answer:
    """Send the byte strings (a float: pause that long) and read until the server closes."""
    host, port = address.rsplit(":", 1)
    start = time.monotonic()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for part in parts:
            if isinstance(part, float):
                await asyncio.sleep(part)  # the client's own pacing: what is under test
            else:
                writer.write(part)
                await writer.drain()
        async with asyncio.timeout(timeout):
            raw = await reader.read()
        return Answer(raw, time.monotonic() - start)
    finally:
        writer.close()


def post(
    path: str,
    body: bytes,
    headers: str = ALICE,
    length: int | None = None,
    content_type: str | None = "application/json",
) -> bytes:
    """A request's bytes; `headers` are lines of latin-1 text, so "\xff" is the byte 0xff on the wire."""
    size = len(body) if length is None else length
    media = "" if content_type is None else f"Content-Type: {content_type}\r\n"
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\n{media}Content-Length: {size}\r\nConnection: close\r\n{headers}\r\n"
    ).encode("latin-1") + body


CHAT_BODY = json.dumps(chat(max_tokens=2)).encode()
COMPLETION_BODY = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 2}).encode()


def rejected(server: SchedulerServer, reason: str) -> float:
    value = server.scheduler.metrics.registry.get_sample_value(
        "llmsched_requests_rejected_total", {"model": "_unknown", "reason": reason}
    ) or server.scheduler.metrics.registry.get_sample_value(
        "llmsched_requests_rejected_total", {"model": "m", "reason": reason}
    )
    return value or 0.0


def internal_errors(server: SchedulerServer) -> float:
    registry = server.scheduler.metrics.registry
    return sum(
        s.value
        for m in registry.collect()
        if m.name == "llmsched_internal_errors"
        for s in m.samples
        if s.name == "llmsched_internal_errors_total"
    )


async def test_slow_headers_get_408_and_the_connection_is_closed() -> None:
    engine = ControlledEngine(auto_release=True)
    async with http_serving(engine.factory(), server=FAST) as (server, _):
        address = server.http_address
        answer = await exchange(address, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        assert answer.status == 408 and answer.error()["code"] == "read_timeout"
        assert answer.headers["x-should-retry"] == "true" and answer.headers["connection"] == "close"
        assert 0.25 < answer.seconds < 2.0
        # A connection that sends nothing is closed when idle, without an answer.
        silent = await exchange(address)
        assert silent.raw == b"" and 0.35 < silent.seconds < 2.0
        assert rejected(server, "read_timeout") == 1


async def test_a_kept_alive_connection_is_closed_once_idle() -> None:
    engine = ControlledEngine(auto_release=True)
    async with http_serving(engine.factory(), server=FAST) as (server, _):
        host, port = server.http_address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            request = post("/v1/chat/completions", CHAT_BODY).replace(b"Connection: close\r\n", b"")
            writer.write(request)
            await writer.drain()
            start = time.monotonic()
            async with asyncio.timeout(5):
                data = await reader.read()  # the answer, then the close once idle
            assert data.startswith(b"HTTP/1.1 200") and 0.35 < time.monotonic() - start < 3.0
        finally:
            writer.close()


@pytest.mark.parametrize(
    ("parts", "status", "code"),
    [
        ((post("/v1/chat/completions", b"", length=1000),), 408, "read_timeout"),  # announced, never sent
        ((post("/v1/chat/completions", b'{"model": "m", ', length=100), 0.1, b'"x": 1'), 408, "read_timeout"),
        ((post("/v1/chat/completions", b"{", length=100_000_000),), 413, "prompt_too_large"),  # refused at once
    ],
)
async def test_bodies_are_bounded_in_time_and_size(parts: tuple[bytes | float, ...], status: int, code: str) -> None:
    engine = ControlledEngine(auto_release=True)
    async with http_serving(engine.factory(), server=FAST) as (server, _):
        answer = await exchange(server.http_address, *parts)
    assert (answer.status, answer.error()["code"]) == (status, code)
    assert answer.seconds < 2.5


async def test_a_call_waiting_for_100_continue_is_refused_before_its_body_or_told_to_send_it() -> None:
    """`Expect: 100-continue`: a call the door would refuse before reading a body (no identity, not JSON, too
    large) gets that answer instead of `100 Continue`, so the client never uploads; an acceptable one is told
    to go on."""
    expect = "Expect: 100-continue\r\n"
    engine = ControlledEngine(auto_release=True)
    async with http_serving(engine.factory(), server=FAST) as (server, _):
        address = server.http_address
        anonymous = await exchange(address, post("/v1/chat/completions", b"", expect, len(CHAT_BODY)))
        too_large = await exchange(address, post("/v1/chat/completions", b"", ALICE + expect, 100_000_000))
        a_form = post("/v1/chat/completions", b"", ALICE + expect, len(CHAT_BODY), "application/x-www-form-urlencoded")
        not_json = await exchange(address, a_form)
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(post("/v1/chat/completions", b"", ALICE + expect, len(CHAT_BODY)))
            async with asyncio.timeout(5):
                interim = await reader.readuntil(b"\r\n\r\n")
                writer.write(CHAT_BODY)
                final = Answer(await reader.read(), 0.0)
        finally:
            writer.close()
    assert (anonymous.status, anonymous.error()["code"]) == (401, "unauthenticated")
    assert (too_large.status, too_large.error()["code"]) == (413, "prompt_too_large")
    assert (not_json.status, not_json.error()["code"]) == (415, "unsupported_content_type")
    assert b"100 Continue" not in anonymous.raw + too_large.raw + not_json.raw
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n" and final.status == 200


JSON_TYPES = [None, "application/json", "Application/JSON; charset=UTF-8", "application/json;charset=latin-1"]
JSON_TYPES += ["application/vnd.api+json", " application/merge-patch+json ; q=1", ""]
OTHER_TYPES = ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded"]
OTHER_TYPES += ["multipart/form-data; boundary=x", "application/octet-stream", "application/jsonl", "application/+json"]
OTHER_TYPES += ["json", "*/*", "text/json"]


async def test_a_body_declared_as_anything_but_json_is_415_before_it_is_read() -> None:
    """A Content-Type naming JSON (any case, any parameters, a `+json` type) or none at all is read as JSON;
    any other media type is refused with 415 naming the type to send, its body unread and no engine asked."""
    engine = ControlledEngine(auto_release=True)
    async with http_serving(engine.factory()) as (server, _):
        address = server.http_address
        served = [
            (await exchange(address, post("/v1/completions", COMPLETION_BODY, content_type=t))).status
            for t in JSON_TYPES
        ]
        refused = [
            await exchange(address, post("/v1/chat/completions", CHAT_BODY, content_type=t)) for t in OTHER_TYPES
        ]
        twice = await exchange(address, post("/v1/chat/completions", CHAT_BODY, "Content-Type: text/plain\r\n" + ALICE))
        counted = rejected(server, "unsupported_content_type")
    assert served == [200] * len(JSON_TYPES)
    assert [answer.status for answer in refused] == [415] * len(OTHER_TYPES)
    for content_type, answer in zip(OTHER_TYPES, refused, strict=True):
        error = answer.error()
        assert (error["code"], error["type"], error["param"]) == (
            "unsupported_content_type",
            "invalid_request_error",
            None,
        )
        assert repr(content_type) in error["message"] and "'Content-Type: application/json'" in error["message"]
        assert answer.headers["x-should-retry"] == "false" and answer.headers["connection"] == "close"
    assert (twice.status, twice.error()["code"]) == (400, "malformed_request"), "never first-wins: aiohttp refuses it"
    assert counted == len(OTHER_TYPES)
    assert len(engine.started) == len(JSON_TYPES)


async def test_a_deadline_that_passes_while_the_body_uploads_is_a_timeout_not_a_bad_request() -> None:
    """The call's deadline counts from its headers: past it once the body is in, the answer is the door's
    timeout for a deadline (504 deadline_exceeded, not retried), never a 400, and no engine is asked. The
    client's own pacing is the input here, so it pauses on the wall clock."""
    engine = ControlledEngine(auto_release=True)
    deadline = "x-request-timeout-ms: 100\r\n"
    head, tail = CHAT_BODY[:10], CHAT_BODY[10:]
    async with http_serving(engine.factory()) as (server, _):
        address = server.http_address
        late = await exchange(address, post("/v1/chat/completions", head, ALICE + deadline, len(CHAT_BODY)), 0.3, tail)
        in_time = await exchange(address, post("/v1/chat/completions", CHAT_BODY, ALICE + deadline))
        counted = rejected(server, "deadline_exceeded")
    assert (late.status, late.error()["code"], late.error()["type"]) == (504, "deadline_exceeded", "server_error")
    assert late.headers["x-should-retry"] == "false" and "deadline" in late.error()["message"]
    assert counted == 1 and in_time.status == 200 and len(engine.started) == 1


async def test_a_body_still_arriving_at_the_calls_deadline_is_answered_then() -> None:
    """A stalled body is given up on at the call's deadline when that comes before the body timeout: 504
    deadline_exceeded then, not a 408 once the body timeout passes (a minute here: the answer could not
    come within the exchange's 5 s), the connection closed, no engine asked."""
    engine = ControlledEngine(auto_release=True)
    deadline = "x-request-timeout-ms: 200\r\n"
    async with http_serving(engine.factory(), server={**FAST, "http_body_timeout_seconds": 60.0}) as (server, _):
        head = post("/v1/chat/completions", CHAT_BODY[:10], ALICE + deadline, len(CHAT_BODY))
        stalled = await exchange(server.http_address, head)
        counted = rejected(server, "deadline_exceeded")
    assert (stalled.status, stalled.error()["code"]) == (504, "deadline_exceeded")
    assert "body" in stalled.error()["message"] and stalled.headers["connection"] == "close"
    assert counted == 1 and not engine.started


async def test_an_endless_chunked_body_stops_at_the_body_limit() -> None:
    engine = ControlledEngine(auto_release=True)
    async with http_serving(engine.factory(), server={**FAST, "http_max_body_bytes": 4096}) as (server, _):
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n{ALICE}\r\n"
        chunk = b"400\r\n" + b"x" * 1024 + b"\r\n"
        answer = await exchange(server.http_address, head.encode(), *[chunk] * 8)
    assert (answer.status, answer.error()["code"]) == (413, "prompt_too_large")


async def test_bodies_being_read_are_bounded_per_caller_and_in_all_while_others_are_served() -> None:
    """Stalled bodies of one caller fill its share (503 beyond it); those of many callers fill the total past
    each body's first 64 KiB (503); an ordinary call of someone else is read and served meanwhile."""
    engine = ControlledEngine(auto_release=True)
    limits = {
        "http_max_body_bytes": 300_000,
        "http_max_reading_bytes": 600_000,
        "http_max_reading_bytes_per_user": 300_000,
    }
    async with http_serving(engine.factory(), server={**limits, "http_body_timeout_seconds": 5.0}) as (server, base):
        address = server.http_address
        part = b"x" * 200_000  # of a 250,000-byte body that never ends
        stall = [
            post("/v1/chat/completions", part, f"x-user-id: {user}\r\n", 250_000)
            for user in ("m", "m", "n", "o", "p", "q")
        ]
        stalled = [asyncio.create_task(exchange(address, request, 3.0, timeout=10)) for request in stall]
        await asyncio.sleep(0.5)  # the server reads what it takes
        budget = server_budget(server)
        assert budget.user_bytes("m") == 200_000  # its second body: over its share
        # the total: each body's first 64 KiB is free, the rest counts: 4 x (200,000 - 65,536) > 600,000
        assert budget.held <= 600_000
        async with (
            aiohttp.ClientSession() as session,
            session.post(base + "/v1/chat/completions", json=chat(max_tokens=2), headers={"x-user-id": "alice"}) as ok,
        ):
            assert ok.status == 200
        answers = await asyncio.gather(*stalled)
    codes = sorted(a.error()["code"] for a in answers)
    assert codes.count("read_capacity_full") == 2, codes  # m's second, and one of n..q past the total
    assert all(a.status in (503, 408) for a in answers)


def server_budget(server: SchedulerServer) -> ReadBudget:
    assert server.http_door is not None
    return server.http_door.intake.budget


async def test_aiohttp_parse_errors_are_one_line_and_openai_shaped(caplog: pytest.LogCaptureFixture) -> None:
    engine = ControlledEngine(auto_release=True)
    configure_logging("info")  # the one line is an info line
    try:
        async with http_serving(engine.factory(), server=FAST) as (server, _):
            with caplog.at_level(logging.DEBUG, logger="aiohttp"), capture_logs() as logs:
                for garbage in (b"\x16\x03\x01 hello\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"):
                    answer = await exchange(server.http_address, garbage)
                    assert answer.status == 400 and answer.error()["code"] == "malformed_request"
    finally:
        configure_logging("warning")  # as tests/conftest.py sets it
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.records
    lines = [entry for entry in logs if entry.get("reason") == "MALFORMED_REQUEST"]
    assert len(lines) == 2 and not any("exc_info" in entry or "exception" in entry for entry in lines)
    assert rejected(server, "malformed_request") == 2 and internal_errors(server) == 0


LONE = "\\ud800"  # a lone surrogate, as JSON escapes it
MESSAGES = '[{"role": "user", "content": "x"}]'


@pytest.mark.parametrize(
    "body",
    [
        f'{{"model": "m", "messages": [{{"role": "user", "content": "a{LONE}b"}}]}}',
        f'{{"model": "m", "messages": [{{"role": "u{LONE}", "content": "x"}}]}}',
        f'{{"model": "m", "metadata": {{"priority_class": "{LONE}"}}, "messages": {MESSAGES}}}',
        f'{{"model": "m", "messages": {MESSAGES}, "{LONE}": 1}}',
        '{"model": "m", "messages": ' + "[" * 2000 + "]" * 2000 + "}",
        f'{{"model": "m", "messages": {MESSAGES}, "stop": ' + "[" * 20 + "]" * 20 + "}",
    ],
    ids=["content", "role", "metadata-class", "key", "nested-2000", "nested-20"],
)
async def test_bad_unicode_and_deep_nesting_are_400_not_500(body: str) -> None:
    engine = ControlledEngine(auto_release=True)
    async with http_serving(engine.factory()) as (server, _):
        answer = await exchange(server.http_address, post("/v1/chat/completions", body.encode()))
        assert (answer.status, answer.error()["code"]) == (400, "malformed_request"), answer.raw[:300]
        assert internal_errors(server) == 0 and rejected(server, "malformed_request") == 1


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (f'{{"model": "m", "messages": {MESSAGES}, "model": "other"}}', "model"),
        (f'{{"model": "m", "messages": {MESSAGES}, "user": "bob", "user": "carol"}}', "user"),
        ('{"model": "m", "messages": [{"role": "user", "content": "x", "role": "system"}]}', "role"),
        (f'{{"model": "m", "messages": {MESSAGES}, "metadata": {{"team": "a", "team": "b"}}}}', "team"),
    ],
    ids=["model", "user", "message-role", "metadata"],
)
async def test_a_key_named_twice_in_one_object_is_400_whichever_value_would_win(body: str, key: str) -> None:
    engine = ControlledEngine(auto_release=True)
    async with http_serving(engine.factory()) as (server, _):
        answer = await exchange(server.http_address, post("/v1/chat/completions", body.encode()))
        error = answer.error()
        assert (answer.status, error["code"]) == (400, "malformed_request"), answer.raw[:300]
        assert repr(key) in error["message"] and internal_errors(server) == 0
    assert engine.started == []


@pytest.mark.parametrize(
    ("header", "status", "code", "param"),
    [
        (b"x-request-id: a\xffb\r\n", 400, "invalid_request", "x-request-id"),
        (b"x-priority-class: \xc3\r\n", 400, "invalid_request", "x-priority-class"),
        (b"x-request-id: one\r\nx-request-id: two\r\n", 400, "invalid_request", "x-request-id"),
        (b"x-priority-class: batch\r\nx-priority-class: interactive\r\n", 400, "invalid_request", "x-priority-class"),
        (
            b"x-request-timeout-ms: 100\r\nx-request-timeout-ms: 90000\r\n",
            400,
            "invalid_request",
            "x-request-timeout-ms",
        ),
        (b"x-user-id: bob\r\n", 401, "unauthenticated", None),  # a second identity
    ],
)
async def test_headers_the_door_reads_are_single_and_utf8(
    header: bytes, status: int, code: str, param: str | None
) -> None:
    engine = ControlledEngine(auto_release=True)
    async with http_serving(engine.factory()) as (server, _):
        answer = await exchange(
            server.http_address, post("/v1/chat/completions", CHAT_BODY, ALICE + header.decode("latin-1"))
        )
    error = answer.error()
    assert (answer.status, error["code"], error["param"]) == (status, code, param), error
    assert internal_errors(server) == 0


async def test_an_api_key_that_is_not_utf8_is_401_before_anything_else() -> None:
    key = "sk-good"
    auth = {"api_key_sha256": {hashlib.sha256(key.encode()).hexdigest(): "alice"}}
    engine = ControlledEngine(auto_release=True)
    async with http_serving(engine.factory(), auth=auth) as (server, _):
        bad = await exchange(
            server.http_address, post("/v1/chat/completions", CHAT_BODY, "authorization: Bearer sk-\xff\r\n")
        )
        good = await exchange(
            server.http_address, post("/v1/chat/completions", CHAT_BODY, f"authorization: Bearer {key}\r\n")
        )
    assert (bad.status, bad.error()["code"]) == (401, "unauthenticated") and good.status == 200
    assert internal_errors(server) == 0


async def test_a_model_is_retrieved_by_id() -> None:
    engine = ControlledEngine(auto_release=True)
    models = [{"name": name, "backends": [{"name": "b0", "url": "http://127.0.0.1:1"}]} for name in ("m", "org/m-2")]
    async with http_serving(engine.factory(), models=models) as (_, base), aiohttp.ClientSession() as session:
        found = []
        for name in ("m", "org/m-2", "nope"):
            async with session.get(f"{base}/v1/models/{name}", headers={"x-user-id": "alice"}) as response:
                found.append((response.status, await response.json()))
        async with session.get(f"{base}/v1/models/m") as response:  # no identity
            anonymous = response.status
    assert found[0] == (200, {"id": "m", "object": "model", "created": 0, "owned_by": "llm-scheduler"})
    assert found[1][0] == 200 and found[1][1]["id"] == "org/m-2"
    assert found[2][0] == 404 and found[2][1]["error"]["code"] == "model_not_found"
    assert anonymous == 401


async def test_the_deadline_header_bounds_the_whole_call() -> None:
    """`x-request-timeout-ms` bounds the answer too, as the SDKs' timeout and a gRPC deadline do: a running
    request is cut at it (its engine request aborted), 504 deadline_exceeded, counted expired."""
    engine = ControlledEngine(tokens=200)  # never released: it generates until cut
    async with http_serving(engine.factory()) as (server, base), aiohttp.ClientSession() as session:
        start = time.monotonic()
        headers = {"x-user-id": "alice", "x-request-timeout-ms": "500"}
        async with session.post(base + "/v1/chat/completions", json=chat(max_tokens=200), headers=headers) as whole:
            body = await whole.json()
        elapsed = time.monotonic() - start
        async with session.post(
            base + "/v1/chat/completions", json=chat(max_tokens=200, stream=True), headers=headers
        ) as streamed:
            assert streamed.status == 200  # the engine took it: the stream started
            lines = [line async for line in streamed.content]
        await until_settled(server, lambda: outcome_count(server, "expired") == 2)
    assert whole.status == 504 and body["error"]["code"] == "deadline_exceeded" and 0.45 < elapsed < 2.0
    assert whole.headers["x-should-retry"] == "false"
    error = json.loads(lines[-2].removeprefix(b"data: "))  # the last event, then the blank line
    assert error["error"]["code"] == "deadline_exceeded"
    assert len(engine.aborted) == 2 and not engine.finished


async def test_a_bug_is_an_openai_shaped_500_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr("scheduler_svc.http.app.parse_call", broken)
    engine = ControlledEngine(auto_release=True)
    async with http_serving(engine.factory()) as (server, _):
        answer = await exchange(server.http_address, post("/v1/chat/completions", CHAT_BODY))
        assert (answer.status, answer.error()["code"]) == (500, "internal")
        assert answer.headers["content-type"].startswith("application/json")
        assert internal_errors(server) == 1

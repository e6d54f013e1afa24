"""Property-based fuzzing of the live HTTP door over raw sockets (hypothesis), as test_fuzz.py fuzzes gRPC.

Every example sends one to four concurrent requests to the running service: each a route of the door with
a body (a chat or completion request with hostile field values, escaped lone surrogates, deep nesting, other
text encodings, compressed or broken-compressed, random or damaged bytes), framed by Content-Length (right,
short or long), chunked (well or badly) or nothing, and headers of the kinds a client can send (identity
present, missing, doubled or not UTF-8; the headers the door reads with any bytes, doubled; others).
Properties:

- every answer arrives within its deadline, and it is either a success or an error whose status, `code`
  and `x-should-retry` are a row of the error table, in OpenAI's shape exactly, never INTERNAL (a 500);
- a well-formed request of another user, sent beside each example's, succeeds;
- the service logs no traceback;
- afterwards an ordinary call succeeds, and the service's RSS after the last examples is at most 20 MB
  above its RSS after the first 100.

One service instance, in a process of its own, sees every example. `LLMSCHED_HTTP_FUZZ_EXAMPLES` runs more
examples (default 400).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import time
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmsched.v1.errors import ERRORS
from tests.http.support import ChildService, child_service

T = TypeVar("T")
EXAMPLES = int(os.environ.get("LLMSCHED_HTTP_FUZZ_EXAMPLES", "400"))
DEADLINE = 5.0
BODY_TIMEOUT = 0.5  # a body announced longer than sent waits this long for the rest
WINDOW = 100
RSS_GROWTH_LIMIT = 20 * 1024 * 1024
ROUTES = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/m"),
    ("GET", "/v1/models/nope%2Fx"),
]


def _mostly(usual: st.SearchStrategy[T], hostile: st.SearchStrategy[T], odds: int = 4) -> st.SearchStrategy[T]:
    """`usual` but one time in `odds`: most requests must get past each check to fuzz what lies behind it."""
    return st.integers(1, odds).flatmap(lambda i: hostile if i == 1 else usual)


# -- bodies --------------------------------------------------------------------------------------------------

_ASCII = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
_texts = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", " ", "\x00", "\ud800", "a\udfffb", "\u202e", "é", "🙂", "\n\r\t", "m", "batch"]),
    st.builds(lambda chunk, times: chunk * times, st.text(min_size=1, max_size=4), st.integers(0, 5000)),
)
_PAST_FLOAT = st.sampled_from([10**400, -(10**400)])  # integers JSON carries and no float holds
_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), _PAST_FLOAT, st.floats(allow_nan=False), _texts),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_texts, inner, max_size=3),
    max_leaves=8,
)
_messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "developer"]), "content": _texts.filter(str.strip)}
    ),
    min_size=1,
    max_size=3,
)
_VALID: dict[str, st.SearchStrategy[Any]] = {
    "max_tokens": st.integers(1, 8),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "stop": st.lists(st.text(min_size=1, max_size=4), max_size=3),
    "seed": st.integers(0, 2**31),
    "stream": st.booleans(),
    "n": st.just(1),
    "metadata": st.fixed_dictionaries({"priority_class": st.sampled_from(["interactive", "batch"])}),
    "user": st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._@+:/-]{0,19}", fullmatch=True),  # an end user id
    "prompt_cache_key": st.text(_ASCII, max_size=20),
}
_FIELDS = [*_VALID, "model", "messages", "prompt", "stream_options", "max_completion_tokens", "logprobs", "tools"]


@st.composite
def _request_body(draw: st.DrawFn) -> dict[str, Any]:
    """A valid request with up to three fields made hostile (none, a quarter of the time)."""
    body: dict[str, Any] = {"model": "m"}
    if draw(st.booleans()):
        body["messages"] = draw(_messages)
    else:
        body["prompt"] = draw(_texts.filter(str.strip))
    for name, values in _VALID.items():
        if draw(st.booleans()):
            body[name] = draw(values)
    if body.get("stream") and draw(st.booleans()):
        body["stream_options"] = {"include_usage": draw(st.booleans())}
    for name in draw(_mostly(st.just([]), st.lists(st.sampled_from(_FIELDS), min_size=1, max_size=3, unique=True))):
        body[name] = draw(_json_values)
    return body


def _serialize(body: dict[str, Any], encoding: str) -> bytes:
    text = json.dumps(body)  # ASCII: lone surrogates become \ud800 escapes
    return text.encode(encoding)


@st.composite
def _damaged(draw: st.DrawFn, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(draw(st.integers(1, 4)) if data else 0):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(0, len(data)))] if draw(st.booleans()) else data)


_bodies = _mostly(
    st.builds(_serialize, _request_body(), st.sampled_from(["ascii", "ascii", "utf-8-sig", "utf-16", "utf-32"])),
    st.one_of(
        _request_body().map(lambda b: _serialize(b, "ascii")).flatmap(_damaged),
        st.binary(max_size=300),
        st.integers(1, 3000).map(lambda n: ('{"model": "m", "messages": ' + "[" * n + "]" * n + "}").encode()),
        _json_values.map(lambda v: json.dumps(v).encode()),
    ),
)

# -- headers -------------------------------------------------------------------------------------------------

_bytes = st.one_of(
    st.text(_ASCII, max_size=40).map(str.encode),
    st.binary(max_size=30).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
    st.sampled_from([b"", b" ", b"\xff", b"\xc3", b"\xed\xa0\x80", "é".encode(), b"200", b"true", b"batch"]),
)
_read_headers = st.sampled_from(
    ["x-request-id", "x-priority-class", "x-request-timeout-ms", "x-queue-updates", "authorization", "x-user-id"]
)
_other_headers = st.one_of(
    st.sampled_from(["content-type", "accept", "user-agent", "x-stainless-timeout", "expect", "connection"]),
    st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=16),
)
_headers = st.lists(st.tuples(st.one_of(_read_headers, _other_headers), _bytes), max_size=4)
_identity = _mostly(
    st.sampled_from([[("x-user-id", b"alice")], [("x-user-id", b"bob")]]),
    st.lists(st.tuples(st.just("x-user-id"), _bytes), max_size=2),
)


@dataclass
class Request:
    route: tuple[str, str]
    body: bytes
    framing: str  # length, chunked, bad-chunks, short, long, none
    compression: str  # none, gzip, broken
    headers: list[tuple[str, bytes]]

    def wire(self) -> bytes:
        method, path = self.route
        body = self.body
        lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: fuzz", b"Connection: close"]
        lines += [name.encode() + b": " + value for name, value in self.headers]
        if self.compression == "gzip":
            body = gzip.compress(body)
            lines.append(b"Content-Encoding: gzip")
        elif self.compression == "broken":
            lines.append(b"Content-Encoding: gzip")
        if method == "GET" and self.framing in ("length", "none"):
            return b"\r\n".join(lines) + b"\r\n\r\n"
        if self.framing in ("chunked", "bad-chunks"):
            lines.append(b"Transfer-Encoding: chunked")
            size = b"zz" if self.framing == "bad-chunks" else f"{len(body):x}".encode()
            framed = size + b"\r\n" + body + b"\r\n0\r\n\r\n" if body else b"0\r\n\r\n"
            return b"\r\n".join(lines) + b"\r\n\r\n" + framed
        if self.framing != "none":
            announced = len(body) + (3 if self.framing == "short" else -3 if self.framing == "long" else 0)
            lines.append(f"Content-Length: {max(0, announced)}".encode())
        return b"\r\n".join(lines) + b"\r\n\r\n" + body


_requests = st.builds(
    Request,
    route=_mostly(st.sampled_from(ROUTES[:2]), st.sampled_from(ROUTES), odds=8),
    body=_bodies,
    framing=_mostly(st.just("length"), st.sampled_from(["chunked", "bad-chunks", "short", "long", "none"]), odds=8),
    compression=_mostly(st.just("none"), st.sampled_from(["gzip", "broken"]), odds=8),
    headers=st.builds(lambda identity, more: identity + more, _identity, _mostly(st.just([]), _headers, odds=2)),
)

# -- the properties ------------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return bytes(out)


async def _send(address: str, request: Request) -> Answer:
    """Send the request; read its answer (to its end, not to the close: after an early answer the server
    reads on for a moment before it closes)."""
    host, port = address.rsplit(":", 1)
    start = time.monotonic()
    reader, writer = await asyncio.open_connection(host, int(port))
    head, body = b"", b""
    try:
        writer.write(request.wire())
        await writer.drain()
        async with asyncio.timeout(DEADLINE):
            head = await reader.readuntil(b"\r\n\r\n")
            length = _header(head, b"content-length")
            if length is not None:
                body = await reader.readexactly(int(length))
            elif _header(head, b"transfer-encoding") == b"chunked":
                while not body.endswith(b"\r\n0\r\n\r\n") and not reader.at_eof():
                    body += await reader.read(65536)
            else:
                body = await reader.read()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()
    lines = head.decode("latin-1").split("\r\n")
    # HTTP/1.0 when the request line itself could not be read
    status = int(lines[0].split()[1]) if lines[0].startswith(("HTTP/1.1 ", "HTTP/1.0 ")) else 0
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if headers.get("transfer-encoding") == "chunked":
        body = _dechunk(body)
    return Answer(status, headers, body, time.monotonic() - start)


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def _check(request: Request, answer: Answer) -> None:
    """The answer is a success, or an error row of the table in OpenAI's shape; never INTERNAL."""
    where = f"{request}\n-> {answer}"
    assert answer.status, f"no answer: {where}"
    assert answer.seconds < DEADLINE, where
    if answer.status == 200:
        return
    body = json.loads(answer.body)
    assert set(body) == {"error"}, where
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, where
    assert isinstance(error["message"], str) and isinstance(error["type"], str), where
    assert error["param"] is None or isinstance(error["param"], str), where
    reason = error["code"].upper()
    assert reason in ERRORS and reason != "INTERNAL", where
    spec = ERRORS[reason]
    assert answer.status == spec.http_status, where
    assert answer.headers.get("x-should-retry") == ("true" if spec.retryable else "false"), where


BYSTANDER = Request(
    ("POST", "/v1/chat/completions"),
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
    "length",
    "none",
    [("x-user-id", b"bystander")],
)
"""A well-formed request of a user no example sends as, beside every example's requests: it is served."""

FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,  # the same examples on every run and machine
    database=None,
    deadline=None,  # one example can take a while on a busy machine; hangs are the deadline property's job
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


def _run(loop: asyncio.AbstractEventLoop, service: ChildService, requests: list[Request]) -> list[Answer]:
    async def batch() -> list[Answer]:
        return list(await asyncio.gather(*(_send(service.http_address, r) for r in requests)))

    return loop.run_until_complete(batch())


@pytest.mark.timeout(600)
def test_no_http_input_gets_a_500_a_hang_an_answer_off_the_table_or_a_leak() -> None:
    rss: list[int] = []
    statuses: dict[int, int] = {}
    loop = asyncio.new_event_loop()
    server = {"http_body_timeout_seconds": BODY_TIMEOUT, "http_header_timeout_seconds": 2.0}
    try:
        with child_service(server) as service:

            @FUZZ
            @given(requests=st.lists(_requests, min_size=1, max_size=4))
            def example(requests: list[Request]) -> None:
                *answers, bystander = _run(loop, service, [*requests, BYSTANDER])
                for request, answer in zip(requests, answers, strict=True):
                    _check(request, answer)
                    statuses[answer.status] = statuses.get(answer.status, 0) + 1
                assert bystander.status == 200, f"{requests}\n-> the bystander got {bystander}"
                rss.append(service.rss_bytes())

            example()
            body = b'{"model": "m", "prompt": "hi"}'
            ordinary = Request(("POST", "/v1/completions"), body, "length", "none", [("x-user-id", b"a")])
            assert _run(loop, service, [ordinary])[0].status == 200
            log = service.server_log()
    finally:
        loop.close()
    print(f"HTTP door fuzz: {len(rss)} examples, {sum(statuses.values())} requests, answers by status {statuses}")
    assert "Traceback" not in log and "internal_error" not in log, log
    assert len(rss) >= 2 * WINDOW, f"only {len(rss)} examples ran"
    growth = rss[-1] - rss[WINDOW - 1]
    assert growth <= RSS_GROWTH_LIMIT, f"service RSS grew {growth / 2**20:.1f} MB"

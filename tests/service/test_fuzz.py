"""Property-based fuzzing of the live gRPC server over a real socket (hypothesis).

Every example sends one to four concurrent calls to the running service: each picks an RPC of
llmsched.v1.SchedulerService and a body (a message with hostile field values, random bytes, or a valid
message with bytes flipped or cut), with random metadata of the kinds grpcio can send. Properties:

- no answer is UNKNOWN or INTERNAL (the service understood, whatever it said);
- a well-formed Stream of another user, sent beside each example's calls, succeeds;
- every answer arrives before its 5 s deadline (nothing hangs);
- afterwards a normal Submit and Stream succeed;
- the service's RSS after the last 100 examples is at most 20 MB above its RSS after the first 100.

One service instance sees every example (state left by earlier examples is part of what is fuzzed). It
runs in a child process (tests/service/fuzz_server.py) so that its RSS is measured alone: hypothesis
keeps what it generated until the run ends, which grew this process by about 30 MB per 100 examples
while the service stayed flat. The examples are synchronous and call a grpc.aio channel on an event loop
in a background thread. `LLMSCHED_FUZZ_EXAMPLES` runs more examples (default 400).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients import pb
from tests.helpers import ChildProcessService

T = TypeVar("T")
SERVICE = "/llmsched.v1.SchedulerService"
DEADLINE = 5.0
EXAMPLES = int(os.environ.get("LLMSCHED_FUZZ_EXAMPLES", "400"))
WINDOW = 100  # examples at each end of the run whose RSS is compared
RSS_GROWTH_LIMIT = 20 * 1024 * 1024
FORBIDDEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
ROOT = Path(__file__).resolve().parents[2]

# -- the service under test ----------------------------------------------------------------------------


@dataclass
class LiveService(ChildProcessService):
    """The service in a child process, and a channel to it on an event loop in a background thread."""

    loop: asyncio.AbstractEventLoop
    channel: grpc.aio.Channel

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


@contextmanager
def live_service() -> Iterator[LiveService]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tests.service.fuzz_server"]
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
        )
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="fuzz-client", daemon=True)
        thread.start()
        try:
            assert process.stdout is not None and process.stdin is not None
            address = process.stdout.readline().strip()
            if not address:
                log.seek(0)
                raise RuntimeError(f"the fuzzed service did not start:\n{log.read()}")

            async def connect() -> grpc.aio.Channel:
                return grpc.aio.insecure_channel(address)

            service = LiveService(process, log, loop, asyncio.run_coroutine_threadsafe(connect(), loop).result(10))
            try:
                yield service
            finally:
                service.run(service.channel.close(None))
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
            if process.stdin is not None:
                process.stdin.close()  # the service stops when its stdin closes
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# -- what a client can send ------------------------------------------------------------------------------


def _repeated(alphabet: st.SearchStrategy[str], most: int) -> st.SearchStrategy[str]:
    """A long string without making hypothesis draw every character (fast, and still huge)."""
    return st.builds(lambda chunk, times: chunk * times, alphabet, st.integers(0, most))


def _mostly(usual: st.SearchStrategy[T], hostile: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """`usual` three times in four: most requests must get past validation to fuzz what lies behind it."""
    return st.integers(0, 3).flatmap(lambda i: hostile if i == 0 else usual)


_ASCII = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
_texts = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(codec="utf-8"), max_size=40),  # any code point protobuf can carry
    st.sampled_from(["", " ", "\x00", "m\x00", "\u202e", "é" * 3, "🙂", "\n\r\t"]),
    _repeated(st.text(min_size=1, max_size=8), 40_000),  # up to ~300 KB
)
_prompts = st.one_of(st.sampled_from(["hello", "a b c"]), st.text(min_size=1, max_size=200).filter(str.strip))
_users = _mostly(st.sampled_from(["alice", "bob", "carol"]), st.text(_ASCII, max_size=40))
_int32 = st.one_of(st.sampled_from([0, -1, 1, 2, 2**31 - 1, -(2**31)]), st.integers(-(2**31), 2**31 - 1))
_floats = st.floats(width=32, allow_nan=True, allow_infinity=True)
# Ids that collide with live requests of the same user (ALREADY_EXISTS) are part of the input: a Submit and a
# Stream of alice with id "req.3:a/b-c_d" in class batch, sent together, must not leave the Stream waiting to
# its deadline. False sends only ids that cannot collide.
LIVE_DUPLICATE_IDS = True
_ADMISSIBLE_ID = re.compile(r"^[A-Za-z0-9._:/-]{1,128}$")  # scheduler_svc.core.admission's request_id rule
_request_ids = st.one_of(_texts, st.text(max_size=200))
if not LIVE_DUPLICATE_IDS:
    _request_ids = _request_ids.filter(lambda rid: rid == "" or not _ADMISSIBLE_ID.match(rid))

_VALID: dict[str, st.SearchStrategy[Any]] = {
    "model": st.just("m"),
    "priority_class": st.sampled_from(["", "interactive", "review", "batch"]),
    # few ids, so concurrent calls of one example reuse ids of live requests
    "request_id": st.sampled_from(["", "dup-1", "dup-2", "req.3:a/b-c_d"] if LIVE_DUPLICATE_IDS else [""]),
    "max_tokens": st.integers(1, 16),
    "temperature": st.floats(0, 10),
    "top_p": st.floats(0.01, 1),
    "stop": st.lists(st.text(min_size=1, max_size=8), max_size=16),
    "seed": st.integers(-(2**63), 2**63 - 1),
}
_HOSTILE: dict[str, st.SearchStrategy[Any]] = {
    "model": _texts,
    "priority_class": _texts,
    "request_id": _request_ids,
    "max_tokens": _int32,
    "temperature": _floats,
    "top_p": _floats,
    "stop": st.lists(_texts, max_size=40),
    "prompt": _texts,
    "messages": st.lists(st.builds(pb.ChatMessage, role=_texts, content=_texts), max_size=4),
}


@st.composite
def _generate_request(draw: st.DrawFn, kind: type[pb.SubmitRequest] | type[pb.StreamRequest]) -> bytes:
    """A valid request with up to three fields made hostile (none, a quarter of the time)."""
    fields: dict[str, Any] = {"model": "m", "ignore_eos": draw(st.booleans())}
    if draw(st.booleans()):
        fields["prompt"] = draw(_prompts)
    else:
        roles = st.sampled_from(["system", "user", "assistant", "tool"])
        fields["messages"] = draw(
            st.lists(st.builds(pb.ChatMessage, role=roles, content=_prompts), min_size=1, max_size=4)
        )
    for name, values in _VALID.items():
        if draw(st.booleans()):
            fields[name] = draw(values)
    for name in draw(st.lists(st.sampled_from(sorted(_HOSTILE)), max_size=3, unique=True)):
        fields[name] = draw(_HOSTILE[name])
    return kind(params=pb.GenerationParams(**fields)).SerializeToString()


@st.composite
def _damaged(draw: st.DrawFn, body: st.SearchStrategy[bytes]) -> bytes:
    """A message with some bytes flipped and maybe cut short: mostly almost-valid protobuf."""
    raw = bytearray(draw(body))
    for _ in range(draw(st.integers(1, 4)) if raw else 0):
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    return bytes(raw[: draw(st.integers(0, len(raw)))] if draw(st.booleans()) else raw)


def _bodies(message: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Mostly a message; else the message damaged, or random bytes."""
    return _mostly(message, st.one_of(_damaged(message), st.binary(max_size=300)))


_queue_state = st.builds(
    lambda model: pb.GetQueueStateRequest(model=model).SerializeToString(), _mostly(st.sampled_from(["", "m"]), _texts)
)
_calls = st.one_of(
    st.tuples(st.just("Submit"), _bodies(_generate_request(pb.SubmitRequest))),
    st.tuples(st.just("Stream"), _bodies(_generate_request(pb.StreamRequest))),
    st.tuples(st.just("GetQueueState"), _bodies(_queue_state)),
)

# Metadata grpcio can send: lowercase ASCII keys; printable ASCII values, or any bytes for `-bin` keys.
# (Reserved names such as content-type, te or grpc-timeout pass too: grpcio sends or drops them quietly.)
_keys = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=24).filter(
    lambda k: not k.endswith("-bin")
)
_common_keys = st.sampled_from(["content-type", "te", "user-agent", "grpc-timeout", "grpc-encoding", "x-user-id"])
_printable = st.text(_ASCII, max_size=120)
_metadata = st.lists(
    st.one_of(
        st.tuples(_keys, _printable),
        st.tuples(_keys.map(lambda k: f"{k}-bin"), st.binary(max_size=120)),
        st.tuples(st.one_of(_common_keys, st.just("authorization")), _printable),
    ),
    max_size=5,
)
_identities = _mostly(st.tuples(st.tuples(st.just("x-user-id"), _users)), st.just(()))


# -- the properties ----------------------------------------------------------------------------------------


@dataclass
class Answer:
    method: str
    code: grpc.StatusCode
    details: str
    seconds: float


async def _call(channel: grpc.aio.Channel, method: str, body: bytes, metadata: tuple[Any, ...]) -> Answer:
    """Send raw bytes (identity serializers) with a deadline; report the status the server gave."""
    path = f"{SERVICE}/{method}"
    start = time.monotonic()
    try:
        if method == "Stream":
            async for _ in channel.unary_stream(path, request_serializer=None, response_deserializer=None)(
                body, metadata=metadata, timeout=DEADLINE
            ):
                pass
        else:
            await channel.unary_unary(path, request_serializer=None, response_deserializer=None)(
                body, metadata=metadata, timeout=DEADLINE
            )
        code, details = grpc.StatusCode.OK, ""
    except grpc.aio.AioRpcError as exc:
        code, details = exc.code(), exc.details() or ""
    return Answer(method, code, details, time.monotonic() - start)


async def _batch(channel: grpc.aio.Channel, calls: list[tuple[str, bytes, tuple[Any, ...]]]) -> list[Answer]:
    waits: list[Awaitable[Answer]] = [_call(channel, m, b, md) for m, b, md in calls]
    return list(await asyncio.gather(*waits))


BYSTANDER = (
    "Stream",
    pb.StreamRequest(params=pb.GenerationParams(model="m", prompt="hello", max_tokens=2)).SerializeToString(),
    (("x-user-id", "bystander"),),
)
"""A well-formed call of a user no example sends as, beside every example's calls: it is served."""

FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,  # the same examples on every run and machine
    database=None,
    deadline=None,  # one example can take a while on a busy machine; hangs are the deadline property's job
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


@pytest.mark.timeout(600)  # a green run takes seconds; a red one shrinks its example, 5 s a hang
def test_no_input_gets_unknown_or_internal_hangs_or_leaks() -> None:
    rss: list[int] = []
    with live_service() as service:

        @FUZZ
        @given(calls=st.lists(st.tuples(_calls, _identities, _metadata), min_size=1, max_size=4))
        def example(calls: list[tuple[tuple[str, bytes], tuple[Any, ...], list[tuple[str, Any]]]]) -> None:
            batch = [(method, body, (*identity, *metadata)) for (method, body), identity, metadata in calls]
            *answers, bystander = service.run(_batch(service.channel, [*batch, BYSTANDER]))
            assert bystander.code == grpc.StatusCode.OK, f"{batch}\n-> the bystander got {bystander}"
            for answer in answers:
                assert answer.code not in FORBIDDEN, f"{answer}\n{service.server_log()}"
                assert answer.code != grpc.StatusCode.DEADLINE_EXCEEDED, answer
                assert answer.seconds < DEADLINE, answer
            rss.append(service.rss_bytes())

        example()

        normal = (("x-user-id", "alice"),)
        params = pb.GenerationParams(model="m", prompt="hello", max_tokens=2)
        submit = pb.SubmitRequest(params=params).SerializeToString()
        stream = pb.StreamRequest(params=params).SerializeToString()
        for method, body in (("Submit", submit), ("Stream", stream)):
            answer = service.run(_call(service.channel, method, body, normal))
            assert answer.code == grpc.StatusCode.OK, answer

    assert len(rss) >= 3 * WINDOW, f"only {len(rss)} examples ran"
    growth = rss[-1] - rss[WINDOW - 1]
    every_window = [f"{r / 2**20:.1f}" for r in rss[WINDOW - 1 :: WINDOW]]
    assert growth <= RSS_GROWTH_LIMIT, f"service RSS (MB) every {WINDOW} examples: {every_window}"

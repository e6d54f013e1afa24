"""The cluster's messages: every type survives its JSON codec, alone and in batches, errors come back as the same
class with their retry hint, and anything malformed is a MessageError (counted and dropped by the agent, never
fatal, never the loss of the rest of its batch)."""

from __future__ import annotations

import pytest

from backends.errors import BackendError, BackendOverloaded, BackendUnavailable
from scheduler_svc.cluster.messages import (
    MAX_BATCH_BYTES,
    MAX_MESSAGE_BYTES,
    ROSTER_PART_IDS,
    Admit,
    ErrorInfo,
    Fail,
    Grant,
    Message,
    MessageError,
    Position,
    Report,
    Roster,
    Running,
    Stepdown,
    Tokens,
    Verdict,
    decode,
    decode_batch,
    encode,
    encode_batch,
    error_info,
    rebuild_error,
    roster,
)
from scheduler_svc.core.errors import AlreadyExists, InternalError, QueueBytesFull, QueueFull, QueueTimeout

SAMPLES: list[Message] = [
    Admit("r1", "id", "m", "alice", "standard", "cid", "prompt", 6, 6, 16, 0.5, None, "key"),
    Admit(
        "r1",
        "id",
        "m",
        "alice",
        "standard",
        "",
        "p",
        1,
        1,
        8,
        2.0,
        3.5,
        "",
        force=True,
        running=Running("b0", 3, 2, accepted=True, first_token=False, tokens=0),
    ),
    Verdict("r0", "id"),
    Verdict("r0", "id", ErrorInfo("QueueFull", "full", 1.5)),
    Grant("r0", "id", "b0", None, 1, "r0/token"),
    Report("r1", "id", "accepted"),
    Report("r1", "id", "error", error=ErrorInfo("BackendUnavailable", "down", backend=True)),
    Tokens("r1", {"id": 7, "id2": 0}),
    Report("r1", "id", "ended", outcome="completed", finish_reason="length", prompt_tokens=3, completion_tokens=9),
    Fail("r0", "id", ErrorInfo("QueueTimeout", "expired")),
    Position("r0", "id", 4),
    Stepdown("r0"),
    Roster("r1", ["a", "b"], ["id", "id2"], 1, 3),
]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_survives_the_codec(message: Message) -> None:
    assert decode(encode(message)) == message


def test_errors_come_back_as_their_class_with_the_retry_hint() -> None:
    full = rebuild_error(error_info(QueueFull("cap", retry_after_seconds=2.5)))
    assert type(full) is QueueFull and full.retry_after_seconds == 2.5 and str(full) == "cap"
    assert type(rebuild_error(error_info(QueueBytesFull("bytes", retry_after_seconds=1.0)))) is QueueBytesFull
    assert type(rebuild_error(error_info(AlreadyExists("dup")))) is AlreadyExists
    assert type(rebuild_error(error_info(QueueTimeout("late")))) is QueueTimeout
    assert type(rebuild_error(error_info(BackendUnavailable("down")))) is BackendUnavailable
    assert type(rebuild_error(error_info(BackendOverloaded("busy")))) is BackendOverloaded


def test_an_unknown_error_class_becomes_internal_or_backend_error_by_family() -> None:
    assert type(rebuild_error(ErrorInfo("FutureError", "?"))) is InternalError
    assert type(rebuild_error(ErrorInfo("FutureEngineError", "?", backend=True))) is BackendError


@pytest.mark.parametrize(
    "data",
    [b"not json", b'{"t": "nope"}', b'{"t": "grant", "sender": "r0"}', b"[1, 2]", b"x" * (MAX_MESSAGE_BYTES + 1)],
)
def test_malformed_messages_are_message_errors(data: bytes) -> None:
    with pytest.raises(MessageError):
        decode(data)


def test_a_newer_senders_extra_fields_are_ignored() -> None:
    assert decode(b'{"t": "stepdown", "sender": "r0", "since": 3}') == Stepdown("r0")


def test_a_batch_is_one_entry_and_comes_back_in_order() -> None:
    (entry,) = encode_batch(SAMPLES)
    assert decode_batch(entry) == SAMPLES


def test_a_batch_is_split_before_it_grows_past_the_limit() -> None:
    messages = [Position("r0", f"id{i}", i) for i in range(200)]
    entries = encode_batch(messages, limit=1000)
    assert len(entries) > 1 and all(len(e) <= 1000 for e in entries)
    assert [m for e in entries for m in decode_batch(e)] == messages


def test_a_bad_message_in_a_batch_costs_only_itself() -> None:
    good = Position("r0", "id", 1)
    data = b"[" + encode(good) + b',{"t":"nope"},{"t":"tokens","sender":"r1","counts":{"a":-1}},' + encode(good) + b"]"
    decoded = decode_batch(data)
    assert decoded[0] == good and decoded[3] == good
    assert isinstance(decoded[1], MessageError) and isinstance(decoded[2], MessageError)


@pytest.mark.parametrize("data", [b"not json", b"x" * (MAX_BATCH_BYTES + 1)])
def test_an_undecodable_entry_is_one_message_error(data: bytes) -> None:
    (decoded,) = decode_batch(data)
    assert isinstance(decoded, MessageError)


def test_a_lone_message_object_is_a_batch_of_one() -> None:
    assert decode_batch(encode(Stepdown("r0"))) == [Stepdown("r0")]


def test_a_roster_is_cut_in_parts_each_far_below_the_message_limit() -> None:
    ids = [f"{'x' * 128}~{i:016x}" for i in range(2 * ROSTER_PART_IDS + 1)]  # the longest ids admission makes
    parts = roster("r1", ["m"], ids)
    assert [(p.part, p.parts) for p in parts] == [(0, 3), (1, 3), (2, 3)]
    assert [rid for p in parts for rid in p.request_ids] == ids
    assert all(len(encode(p)) < MAX_MESSAGE_BYTES and decode(encode(p)) == p for p in parts)
    assert roster("r1", ["m"], []) == [Roster("r1", ["m"], [], 0, 1)]  # nothing live: one empty part all the same


@pytest.mark.parametrize(
    "data",
    [
        b'{"t": "roster", "sender": "r1", "request_ids": "id"}',
        b'{"t": "roster", "sender": "r1", "models": [1]}',
        b'{"t": "roster", "sender": "r1", "part": 2, "parts": 2}',
        b'{"t": "roster", "sender": "r1", "part": -1}',
        b'{"t": "roster", "sender": "r1", "part": true, "parts": 2}',
    ],
)
def test_a_malformed_roster_is_a_message_error(data: bytes) -> None:
    with pytest.raises(MessageError):
        decode(data)

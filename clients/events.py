"""Typed stream events and results, converted from the wire messages in one place.

A stream yields, in order (protos/llmsched/v1/scheduler.proto, Stream): `Queued` once at admission, more
`Queued` while the position changes, `Dispatched` once, `Delta`s, then `Finished`; a failure raises a
`SchedulerError` instead of `Finished`. After a failover before the first token (the server's, or a retry
of this client's) the request waits again: `Queued`, then `Dispatched` once more when an engine takes it, as
on the wire (the server announces only attempts an engine took).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from google.protobuf import duration_pb2

from llmsched.v1 import scheduler_pb2 as pb

_FINISH_REASONS: dict[int, str] = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length"}


def _seconds(duration: duration_pb2.Duration) -> float:
    return duration.ToNanoseconds() / 1e9


@dataclass(frozen=True, slots=True)
class Timings:
    """Where the time went, in seconds: queue wait, time to first token (None: no token), total, and how long
    the engine took to take the request in once sent (None: it never answered)."""

    queue_wait: float
    time_to_first_token: float | None
    total: float
    engine_accept: float | None = None

    @classmethod
    def from_pb(cls, timings: pb.Timings) -> Timings:
        ttft = _seconds(timings.time_to_first_token) if timings.HasField("time_to_first_token") else None
        accept = _seconds(timings.engine_accept) if timings.HasField("engine_accept") else None
        return cls(_seconds(timings.queue_wait), ttft, _seconds(timings.total), accept)


@dataclass(frozen=True, slots=True)
class Queued:
    """The request waits: its position among its user's queued requests (1-based), the model's queue depth,
    and the estimated wait in seconds (None while the drain rate is unknown)."""

    request_id: str
    position: int
    model_queue_depth: int
    priority_class: str
    estimated_wait: float | None


@dataclass(frozen=True, slots=True)
class Dispatched:
    """The request went to `backend`, which took it in, after `queue_wait` seconds in the queue."""

    backend: str
    dispatched_at: datetime | None
    queue_wait: float


@dataclass(frozen=True, slots=True)
class Delta:
    """A chunk of generated text carrying `tokens` tokens."""

    text: str
    tokens: int


@dataclass(frozen=True, slots=True)
class Finished:
    """The generation ended: why ("stop", "length" or "unspecified"), token counts and timings."""

    finish_reason: str
    prompt_tokens: int | None
    completion_tokens: int
    timings: Timings


Event = Queued | Dispatched | Delta | Finished


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole generation (Submit's answer)."""

    request_id: str
    text: str
    finish_reason: str
    prompt_tokens: int | None
    completion_tokens: int
    backend: str
    timings: Timings


def finish_reason(value: pb.FinishReason.ValueType) -> str:
    return _FINISH_REASONS.get(value, "unspecified")


def event_from_pb(message: pb.StreamResponse) -> Event:
    """The typed event of one wire message (a message without a known event is a protocol error)."""
    kind = message.WhichOneof("event")
    if kind == "queued":
        q = message.queued
        wait = _seconds(q.estimated_wait) if q.HasField("estimated_wait") else None
        return Queued(q.request_id, q.position_in_user_queue, q.model_queue_depth, q.priority_class, wait)
    if kind == "dispatched":
        d = message.dispatched
        at = d.dispatched_at.ToDatetime() if d.HasField("dispatched_at") else None
        return Dispatched(d.backend, at, _seconds(d.queue_wait))
    if kind == "delta":
        return Delta(message.delta.text, message.delta.tokens)
    if kind == "finished":
        f = message.finished
        prompt = f.usage.prompt_tokens if f.usage.HasField("prompt_tokens") else None
        return Finished(finish_reason(f.finish_reason), prompt, f.usage.completion_tokens, Timings.from_pb(f.timings))
    raise ValueError(f"stream message without a known event: {kind!r}")


def completion_from_pb(response: pb.SubmitResponse) -> Completion:
    usage = response.usage
    return Completion(
        request_id=response.request_id,
        text=response.text,
        finish_reason=finish_reason(response.finish_reason),
        prompt_tokens=usage.prompt_tokens if usage.HasField("prompt_tokens") else None,
        completion_tokens=usage.completion_tokens,
        backend=response.backend,
        timings=Timings.from_pb(response.timings),
    )

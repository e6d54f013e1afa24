"""What replicas tell each other through their inboxes, and how it travels: JSON, many messages per entry.

Owner -> leader: `Admit` (a new request, or with `force` the re-registration of one admitted before, with
`running` when it already runs), `Report` (accepted, first token, an error before the first token, the end),
`Tokens` (tokens generated since the last count, for every running request of the owner at once), `Roster`
(after a re-registration: every live request of the lease's models, in parts). Leader ->
owner: `Verdict` (ok, or the error to answer with), `Grant` (send it to this backend), `Fail` (the leader
ended it: expired, no more failover), `Position`. Anyone -> everyone: `Stepdown` (a leader is leaving or
handing a lease over: look at the leases now).

On the wire a batch is one JSON array of message objects (`encode_batch`: everything one wake-up of the
outbox sends to one replica, split at MAX_BATCH_BYTES), so a receiver parses one stream entry, not one per
message; a lone object is one message.

Errors travel as {kind: class name, message, retry_after} and are rebuilt from `scheduler_svc.core.errors` and
`backends.errors` by name; an unknown name becomes InternalError (or BackendError for the engine's family),
so a newer replica's error never breaks an older one. A message that does not decode is `MessageError`:
counted and dropped, never fatal, and never the loss of the other messages of its batch (inboxes are written
only by replicas, but bounded all the same).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from backends import errors as backend_errors
from scheduler_svc.core import errors as scheduler_errors

MAX_MESSAGE_BYTES = 64 * 1024  # a message carries at most the locality prefix of a prompt (config-bounded)
MAX_BATCH_BYTES = 1024 * 1024  # one stream entry: a batch is split before it grows past this
ROSTER_PART_IDS = 256  # request ids per Roster part: at most ~150 characters each, a part stays far below 64 KiB


class MessageError(ValueError):
    """A message that cannot be decoded (wrong shape, unknown type, too large)."""


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """An error as it travels: its class name, message and retry hint; `backend`: from the engine's family."""

    kind: str
    message: str
    retry_after: float | None = None
    backend: bool = False


@dataclass(frozen=True, slots=True)
class Running:
    """Where a re-registered request already runs, and how far it got (the new leader adopts it)."""

    backend: str
    engine_priority: int | None
    attempt: int
    accepted: bool
    first_token: bool
    tokens: int


@dataclass(frozen=True, slots=True)
class Admit:
    """Owner -> leader: hold a mirror of this request. `text` is the prompt's leading text that locality
    hashes (at most block_chars * max_blocks_per_request characters); times are relative (`age`,
    `remaining` until the deadline), as each process has its own monotonic clock."""

    sender: str
    request_id: str
    model: str
    user: str
    priority_class: str
    client_request_id: str
    text: str
    prompt_chars: int
    prompt_bytes: int
    max_tokens: int
    age: float
    remaining: float | None
    cache_key: str
    force: bool = False
    running: Running | None = None
    watch: bool = False  # the client streams its queue position: the leader sends `Position`s
    end_user: str = ""  # the end user the request is for, inside its user's share (empty: none named)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Leader -> owner: the request is admitted (`error` None) or refused with `error`."""

    sender: str
    request_id: str
    error: ErrorInfo | None = None


@dataclass(frozen=True, slots=True)
class Grant:
    """Leader -> owner: send the request to `backend` now (its `attempt`-th dispatch). `leader` is the lease
    holder that decided: an owner registered with another leader ignores it."""

    sender: str
    request_id: str
    backend: str
    engine_priority: int | None
    attempt: int
    leader: str


REPORT_KINDS = ("accepted", "first_token", "error", "ended")


@dataclass(frozen=True, slots=True)
class Report:
    """Owner -> leader: one event of a running request (`kind` in REPORT_KINDS). `error` for "error" (failed
    before its first token: the owner requeued it and waits); for "ended" the outcome (a `ticket.Outcome`
    value) and the engine's usage. Token counts travel apart, in `Tokens`."""

    sender: str
    request_id: str
    kind: str
    error: ErrorInfo | None = None
    outcome: str = ""
    finish_reason: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Tokens:
    """Owner -> leader: tokens generated since the last count, per request id (the leader's fairness counters).
    One message carries every running request of the owner whose model that leader decides."""

    sender: str
    counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Roster:
    """Owner -> leader, right after the owner registered every live request of `models` with it: part `part`
    (from 0) of `parts` of the ids of those requests. Once every part arrived, in order, the leader ends each
    mirror of the owner's for those models that was registered before the roster and is not in it: a request
    that ended while the owner could not report it (degraded, or between leaders)."""

    sender: str
    models: list[str] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)
    part: int = 0
    parts: int = 1


def roster(sender: str, models: Sequence[str], request_ids: Sequence[str]) -> list[Roster]:
    """The roster of `request_ids` in parts of ROSTER_PART_IDS ids (one part, empty, when there are none)."""
    chunks = [list(request_ids[i : i + ROSTER_PART_IDS]) for i in range(0, len(request_ids), ROSTER_PART_IDS)]
    chunks = chunks or [[]]
    return [Roster(sender, list(models), ids, part, len(chunks)) for part, ids in enumerate(chunks)]


@dataclass(frozen=True, slots=True)
class Fail:
    """Leader -> owner: the leader ended the request with `error`; the owner ends its ticket with it."""

    sender: str
    request_id: str
    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class Position:
    """Leader -> owner: the request's position in its user's queue (for a streaming client)."""

    sender: str
    request_id: str
    position: int


@dataclass(frozen=True, slots=True)
class Stepdown:
    """A leader is leaving (SIGTERM) or handing a lease over: look at the leases at once instead of at the next
    heartbeat."""

    sender: str


Message = Admit | Verdict | Grant | Report | Tokens | Roster | Fail | Position | Stepdown
MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.__name__.lower(): cls for cls in (Admit, Verdict, Grant, Report, Tokens, Roster, Fail, Position, Stepdown)
}
"""Message type names: the `t` field on the wire, and the fixed label values of the message counters."""

_FIELDS: dict[type[Message], tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in MESSAGE_TYPES.values()
}
_NAMES: dict[type[Message], frozenset[str]] = {cls: frozenset(names) for cls, names in _FIELDS.items()}


def type_name(message: Message) -> str:
    return type(message).__name__.lower()


def _plain(value: Any) -> Any:
    """A field's value as JSON takes it (the nested ErrorInfo and Running as objects)."""
    if isinstance(value, (ErrorInfo, Running)):
        return {f.name: getattr(value, f.name) for f in fields(value)}
    return value


def _as_object(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"t": type_name(message)}
    for name in _FIELDS[type(message)]:
        out[name] = _plain(getattr(message, name))
    return out


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def encode(message: Message) -> bytes:
    return _dumps(_as_object(message))


def encode_batch(messages: Sequence[Message], limit: int = MAX_BATCH_BYTES) -> list[bytes]:
    """`messages` as few entries as `limit` allows, in order: JSON arrays of message objects."""
    out: list[bytes] = []
    pending: list[bytes] = []
    size = 2
    for message in messages:
        data = encode(message)
        if pending and size + len(data) + 1 > limit:
            out.append(b"[" + b",".join(pending) + b"]")
            pending, size = [], 2
        pending.append(data)
        size += len(data) + 1
    if pending:
        out.append(b"[" + b",".join(pending) + b"]")
    return out


def decode(data: bytes) -> Message:
    """One message from its bytes; MessageError when it is not one."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise MessageError(f"undecodable message: {type(exc).__name__}: {exc}") from exc
    return _from_object(raw)


def decode_batch(data: bytes) -> list[Message | MessageError]:
    """The messages of one entry (an array, or a lone message object), in order; each one that does not decode
    is a MessageError in its place, so one bad message costs only itself."""
    if len(data) > MAX_BATCH_BYTES:
        return [MessageError(f"batch of {len(data)} bytes exceeds {MAX_BATCH_BYTES}")]
    try:
        raw = json.loads(data)
    except ValueError as exc:
        return [MessageError(f"undecodable batch: {type(exc).__name__}: {exc}")]
    if not isinstance(raw, list):
        raw = [raw]
    out: list[Message | MessageError] = []
    for item in raw:
        try:
            out.append(_from_object(item))
        except MessageError as exc:
            out.append(exc)
    return out


def _from_object(raw: Any) -> Message:
    try:
        cls = MESSAGE_TYPES[raw.pop("t")]
        names = _NAMES[cls]
        values: dict[str, Any] = {k: v for k, v in raw.items() if k in names}  # a newer sender's extra fields
        if isinstance(values.get("error"), dict):
            values["error"] = ErrorInfo(**values["error"])
        if isinstance(values.get("running"), dict):
            values["running"] = Running(**values["running"])
        if cls is Tokens:
            counts = values.get("counts", {})
            if not isinstance(counts, dict) or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts.values()
            ):
                raise MessageError("tokens: counts must map request ids to counts >= 0")
        if cls is Roster:
            _check_roster(values)
        return cls(**values)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise MessageError(f"undecodable message: {type(exc).__name__}: {exc}") from exc


def _check_roster(values: dict[str, Any]) -> None:
    for name in ("models", "request_ids"):
        items = values.get(name, [])
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise MessageError(f"roster: {name} must be a list of strings")
    part, parts = values.get("part", 0), values.get("parts", 1)
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (part, parts)) or not 0 <= part < parts:
        raise MessageError("roster: part must be a whole number from 0 to parts - 1")


def error_info(exc: BaseException) -> ErrorInfo:
    """An error as it travels (its retry hint kept, for QueueFull's RetryInfo)."""
    retry_after = getattr(exc, "retry_after_seconds", None)
    return ErrorInfo(
        kind=type(exc).__name__,
        message=str(exc),
        retry_after=float(retry_after) if retry_after is not None else None,
        backend=isinstance(exc, backend_errors.BackendError),
    )


_REBUILT_FROM_MESSAGE: dict[str, type[scheduler_errors.SchedulerError] | type[backend_errors.BackendError]] = {
    cls.__name__: cls
    for cls in (
        scheduler_errors.InternalError,
        scheduler_errors.InvalidRequest,
        scheduler_errors.MalformedRequest,
        scheduler_errors.ModelNotFound,
        scheduler_errors.Unauthenticated,
        scheduler_errors.PermissionDenied,
        scheduler_errors.AlreadyExists,
        scheduler_errors.QueueTimeout,
        scheduler_errors.ShuttingDown,
        backend_errors.BackendError,
        backend_errors.BackendUnavailable,
        backend_errors.BackendOverloaded,
        backend_errors.BackendRejectedRequest,
        backend_errors.BackendProtocolError,
    )
}
"""Our errors that take only a message, by class name (the others carry a field `rebuild_error` fills in)."""


def rebuild_error(info: ErrorInfo) -> scheduler_errors.SchedulerError | backend_errors.BackendError:
    """The exception `info` describes, of the same class when it is one of ours."""
    if info.kind in ("QueueFull", "QueueBytesFull"):
        cls = scheduler_errors.QueueBytesFull if info.kind == "QueueBytesFull" else scheduler_errors.QueueFull
        return cls(info.message, retry_after_seconds=info.retry_after or 1.0)
    if info.kind == "PromptTooLarge":
        return scheduler_errors.PromptTooLarge(info.message, limit=0)
    if (plain_cls := _REBUILT_FROM_MESSAGE.get(info.kind)) is not None:
        return plain_cls(info.message)
    return backend_errors.BackendError(info.message) if info.backend else scheduler_errors.InternalError(info.message)

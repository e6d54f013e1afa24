"""The scheduler's exception tree: what the core raises, in its own words (no wire protocol here).

    SchedulerError                      a failure reported to the client
    ├── InternalError                   a bug of ours, counted in llmsched_internal_errors_total
    ├── InvalidRequest                  the request is malformed
    │   ├── InvalidField                one named field is unknown, of the wrong type or out of range
    │   ├── PromptTooLarge              the prompt exceeds max_prompt_bytes (the limit travels with it)
    │   ├── MalformedRequest            the body does not decode
    │   └── UnsupportedContentType      the body is sent as something other than JSON (HTTP door)
    ├── ModelNotFound                   the model is not configured
    ├── BackendNotFound                 no backend of that name (an admin's drain)
    ├── Unauthenticated                 no usable caller identity
    ├── PermissionDenied                identified, but not allowed
    ├── AlreadyExists                   a live request of the user has that request_id
    ├── QueueFull                       a queue cap was hit (with a retry delay)
    │   └── QueueBytesFull              a byte cap was hit
    ├── QueueTimeout                    the deadline or queue TTL passed in the queue
    ├── DeadlineExceeded                the call's deadline passed before admission, or while it ran
    ├── ReadTimeout                     the request's headers or body came too slowly (HTTP door)
    ├── ReadCapacityFull                too many request-body bytes being read at once (HTTP door)
    ├── ShuttingDown                    the service is draining
    └── ConfigRefused                   a reload was refused; the running configuration stays
        ├── ConfigInvalid               the file does not load (syntax, a field, a rule between fields)
        └── ConfigNeedsRestart          it changes what only a restart changes, or cannot apply live
    backends.errors.BackendError        the engine failed (the backend port's own tree)

Each class carries a machine-readable `reason` (the ErrorInfo reason clients see). Faces map the tree to
their wire: `scheduler_svc.grpc.status` is the one place that turns exceptions into gRPC statuses.
"""

from __future__ import annotations

from typing import ClassVar


class SchedulerError(Exception):
    """Base class of errors the scheduler reports to clients."""

    reason: ClassVar[str] = "INTERNAL"


class InternalError(SchedulerError):
    """The scheduler itself failed the request (a bug): counted and logged where it happened."""


class InvalidRequest(SchedulerError):
    """The request is malformed; the message says which field and why."""

    reason = "INVALID_REQUEST"


class InvalidField(InvalidRequest):
    """One field (or header) of the request cannot be taken: unknown, of the wrong type, or out of range;
    `param` names it, as OpenAI's error `param` does."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


class PromptTooLarge(InvalidRequest):
    """The prompt, messages and stop strings take more bytes than the model's `max_prompt_bytes`."""

    reason = "PROMPT_TOO_LARGE"

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class AlreadyExists(SchedulerError):
    """The user already has a live request with this request_id."""

    reason = "REQUEST_ID_IN_USE"


class MalformedRequest(InvalidRequest):
    """The request body is not a valid protobuf message of the method's request type (e.g. bad UTF-8)."""

    reason = "MALFORMED_REQUEST"


class UnsupportedContentType(InvalidRequest):
    """The HTTP door was sent a body whose Content-Type names a media type other than JSON."""

    reason = "UNSUPPORTED_CONTENT_TYPE"


class ModelNotFound(SchedulerError):
    """The requested model is not configured."""

    reason = "MODEL_NOT_FOUND"


class BackendNotFound(SchedulerError):
    """No configured backend has that name (an admin's drain)."""

    reason = "BACKEND_NOT_FOUND"


class Unauthenticated(SchedulerError):
    """No usable caller identity."""

    reason = "UNAUTHENTICATED"


class PermissionDenied(SchedulerError):
    """The caller is identified but may not do this."""

    reason = "PERMISSION_DENIED"


class QueueFull(SchedulerError):
    """A queue cap was hit; retry after `retry_after_seconds`."""

    reason = "QUEUE_FULL"

    def __init__(self, message: str, *, retry_after_seconds: float) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class QueueBytesFull(QueueFull):
    """A byte cap (prompt bytes queued or in flight, per user or per model) was hit."""

    reason = "QUEUE_BYTES_FULL"


class QueueTimeout(SchedulerError):
    """The request's deadline or queue TTL passed before it could be dispatched."""

    reason = "QUEUE_TIMEOUT"


class ShuttingDown(SchedulerError):
    """The service is draining and admits nothing new."""

    reason = "SHUTTING_DOWN"


class DeadlineExceeded(SchedulerError):
    """The call's deadline passed before the request was admitted (its HTTP body still uploading), or while its
    answer was being generated (the engine request is aborted)."""

    reason = "DEADLINE_EXCEEDED"


class ReadTimeout(SchedulerError):
    """The HTTP door stopped waiting for a request's headers or body."""

    reason = "READ_TIMEOUT"


class ReadCapacityFull(SchedulerError):
    """The HTTP door holds as many request-body bytes being read as it allows (all callers, or this one)."""

    reason = "READ_CAPACITY_FULL"


class ConfigRefused(SchedulerError):
    """A reload was refused: the running configuration stays; the message says why."""


class ConfigInvalid(ConfigRefused):
    """The configuration file does not load: its syntax, a field, or a rule between fields."""

    reason = "CONFIG_INVALID"


class ConfigNeedsRestart(ConfigRefused):
    """The file is valid but changes what only a restart changes (listeners, TLS, the cluster, the policies,
    an engine's address), or what cannot be applied live now; the message lists each."""

    reason = "CONFIG_NEEDS_RESTART"

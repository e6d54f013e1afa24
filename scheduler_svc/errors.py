"""The scheduler's exception tree, and the one place that turns exceptions into gRPC statuses.

    SchedulerError                      -> INTERNAL
    ├── InternalError                   -> INTERNAL (a bug of ours, counted in llmsched_internal_errors_total)
    ├── InvalidRequest                  -> INVALID_ARGUMENT
    │   ├── PromptTooLarge              -> INVALID_ARGUMENT (reason PROMPT_TOO_LARGE, the limit in metadata)
    │   └── MalformedRequest            -> INVALID_ARGUMENT (the body does not decode)
    ├── ModelNotFound                   -> NOT_FOUND
    ├── Unauthenticated                 -> UNAUTHENTICATED
    ├── PermissionDenied                -> PERMISSION_DENIED
    ├── AlreadyExists                   -> ALREADY_EXISTS (a live request of the user has that request_id)
    ├── QueueFull                       -> RESOURCE_EXHAUSTED (+ google.rpc.RetryInfo)
    │   └── QueueBytesFull              -> RESOURCE_EXHAUSTED (reason QUEUE_BYTES_FULL)
    ├── QueueTimeout                    -> DEADLINE_EXCEEDED
    └── ShuttingDown                    -> UNAVAILABLE
    backends.errors.BackendError        -> its own status_code (UNAVAILABLE, RESOURCE_EXHAUSTED, ...)

Every status carries a `google.rpc.ErrorInfo` with a machine-readable reason.
"""

from __future__ import annotations

from typing import ClassVar

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from backends.errors import BackendError

ERROR_DOMAIN = "llmsched.v1"


class SchedulerError(Exception):
    """Base class of errors the scheduler reports to clients."""

    status_code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL
    reason: ClassVar[str] = "INTERNAL"


class InternalError(SchedulerError):
    """The scheduler itself failed the request (a bug): counted and logged where it happened."""


class InvalidRequest(SchedulerError):
    """The request is malformed; the message says which field and why."""

    status_code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "INVALID_REQUEST"


class PromptTooLarge(InvalidRequest):
    """The prompt, messages and stop strings take more bytes than the model's `max_prompt_bytes`."""

    reason = "PROMPT_TOO_LARGE"

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class AlreadyExists(SchedulerError):
    """The user already has a live request with this request_id."""

    status_code = grpc.StatusCode.ALREADY_EXISTS
    reason = "REQUEST_ID_IN_USE"


class MalformedRequest(InvalidRequest):
    """The request body is not a valid protobuf message of the method's request type (e.g. bad UTF-8)."""

    reason = "MALFORMED_REQUEST"


class ModelNotFound(SchedulerError):
    """The requested model is not configured."""

    status_code = grpc.StatusCode.NOT_FOUND
    reason = "MODEL_NOT_FOUND"


class Unauthenticated(SchedulerError):
    """No usable caller identity."""

    status_code = grpc.StatusCode.UNAUTHENTICATED
    reason = "UNAUTHENTICATED"


class PermissionDenied(SchedulerError):
    """The caller is identified but may not do this."""

    status_code = grpc.StatusCode.PERMISSION_DENIED
    reason = "PERMISSION_DENIED"


class QueueFull(SchedulerError):
    """A queue cap was hit; retry after `retry_after_seconds`."""

    status_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "QUEUE_FULL"

    def __init__(self, message: str, *, retry_after_seconds: float) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class QueueBytesFull(QueueFull):
    """A byte cap (prompt bytes queued or in flight, per user or per model) was hit."""

    reason = "QUEUE_BYTES_FULL"


class QueueTimeout(SchedulerError):
    """The request's deadline or queue TTL passed before it could be dispatched."""

    status_code = grpc.StatusCode.DEADLINE_EXCEEDED
    reason = "QUEUE_TIMEOUT"


class ShuttingDown(SchedulerError):
    """The service is draining and admits nothing new."""

    status_code = grpc.StatusCode.UNAVAILABLE
    reason = "SHUTTING_DOWN"


def _pack(message: object) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)  # type: ignore[arg-type]
    return packed


def to_grpc_status(exc: BaseException) -> grpc.Status:
    """Map any exception to a gRPC status with google.rpc details (unknown ones become INTERNAL)."""
    if isinstance(exc, (SchedulerError, BackendError)):
        code, reason, message = exc.status_code, exc.reason, str(exc)
    else:
        code, reason, message = grpc.StatusCode.INTERNAL, "INTERNAL", f"internal error: {type(exc).__name__}"
    metadata = {"backend": exc.backend} if isinstance(exc, BackendError) and exc.backend else {}
    if isinstance(exc, PromptTooLarge):
        metadata = {"max_prompt_bytes": str(exc.limit)}
    details = [_pack(error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN, metadata=metadata))]
    if isinstance(exc, QueueFull):
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(exc.retry_after_seconds * 1e9))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=message, details=details)
    return rpc_status.to_status(status)

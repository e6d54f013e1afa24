"""The scheduler's exception tree, and the one place that turns exceptions into gRPC statuses.

    SchedulerError                      -> INTERNAL
    ├── InvalidRequest                  -> INVALID_ARGUMENT
    │   └── MalformedRequest            -> INVALID_ARGUMENT (the body does not decode)
    ├── ModelNotFound                   -> NOT_FOUND
    ├── Unauthenticated                 -> UNAUTHENTICATED
    ├── PermissionDenied                -> PERMISSION_DENIED
    ├── QueueFull                       -> RESOURCE_EXHAUSTED (+ google.rpc.RetryInfo)
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


class InvalidRequest(SchedulerError):
    """The request is malformed; the message says which field and why."""

    status_code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "INVALID_REQUEST"


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
    details = [_pack(error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN, metadata=metadata))]
    if isinstance(exc, QueueFull):
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(exc.retry_after_seconds * 1e9))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=message, details=details)
    return rpc_status.to_status(status)

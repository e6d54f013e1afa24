"""The gRPC face's error mapping: the one place that turns exceptions into gRPC statuses.

    exception (scheduler_svc.core.errors / backends.errors)   gRPC status
    SchedulerError, InternalError                         INTERNAL
    InvalidRequest, PromptTooLarge, MalformedRequest      INVALID_ARGUMENT (PromptTooLarge: the limit in metadata)
    UnsupportedContentType                                INVALID_ARGUMENT (HTTP door only)
    ModelNotFound, BackendNotFound                        NOT_FOUND
    Unauthenticated                                       UNAUTHENTICATED
    PermissionDenied                                      PERMISSION_DENIED
    AlreadyExists                                         ALREADY_EXISTS
    QueueFull, QueueBytesFull                             RESOURCE_EXHAUSTED (+ google.rpc.RetryInfo)
    QueueTimeout, DeadlineExceeded, ReadTimeout           DEADLINE_EXCEEDED (ReadTimeout: HTTP door only)
    ShuttingDown, ReadCapacityFull                        UNAVAILABLE (the last: HTTP door only)
    ConfigInvalid, ConfigNeedsRestart                     FAILED_PRECONDITION (a refused reload)
    BackendError, BackendProtocolError                    INTERNAL
    BackendUnavailable                                    UNAVAILABLE
    BackendOverloaded                                     RESOURCE_EXHAUSTED
    BackendRejectedRequest                                INVALID_ARGUMENT
    anything else                                         INTERNAL (reason INTERNAL)

Every status carries a `google.rpc.ErrorInfo` with the exception's `reason` (and the backend's name for
backend errors). The core raises its own exceptions and never sees this table.
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from backends.errors import (
    BackendError,
    BackendOverloaded,
    BackendProtocolError,
    BackendRejectedRequest,
    BackendUnavailable,
)
from scheduler_svc.core.errors import (
    AlreadyExists,
    BackendNotFound,
    ConfigInvalid,
    ConfigNeedsRestart,
    DeadlineExceeded,
    InvalidRequest,
    ModelNotFound,
    PermissionDenied,
    PromptTooLarge,
    QueueFull,
    QueueTimeout,
    ReadCapacityFull,
    ReadTimeout,
    SchedulerError,
    ShuttingDown,
    Unauthenticated,
)

ERROR_DOMAIN = "llmsched.v1"

# The status of each class; a subclass not listed takes its nearest listed base's.
STATUS_CODES: dict[type[Exception], grpc.StatusCode] = {
    SchedulerError: grpc.StatusCode.INTERNAL,
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    ModelNotFound: grpc.StatusCode.NOT_FOUND,
    BackendNotFound: grpc.StatusCode.NOT_FOUND,
    ConfigInvalid: grpc.StatusCode.FAILED_PRECONDITION,
    ConfigNeedsRestart: grpc.StatusCode.FAILED_PRECONDITION,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    QueueFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    QueueTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    ReadTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    ShuttingDown: grpc.StatusCode.UNAVAILABLE,
    ReadCapacityFull: grpc.StatusCode.UNAVAILABLE,
    BackendError: grpc.StatusCode.INTERNAL,
    BackendUnavailable: grpc.StatusCode.UNAVAILABLE,
    BackendOverloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    BackendRejectedRequest: grpc.StatusCode.INVALID_ARGUMENT,
    BackendProtocolError: grpc.StatusCode.INTERNAL,
}


def status_code(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status code for `exc`: its class's, or its nearest mapped base's; INTERNAL otherwise."""
    for cls in type(exc).__mro__:
        code = STATUS_CODES.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def _pack(message: object) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)  # type: ignore[arg-type]
    return packed


def to_grpc_status(exc: BaseException) -> grpc.Status:
    """Map any exception to a gRPC status with google.rpc details (unknown ones become INTERNAL)."""
    if isinstance(exc, (SchedulerError, BackendError)):
        code, reason, message = status_code(exc), exc.reason, str(exc)
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

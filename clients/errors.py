"""Typed errors of the client: one class per gRPC code, each carrying the service's reason, metadata and
retry hint (google.rpc.ErrorInfo and RetryInfo), read the same way from sync and asyncio calls.

    SchedulerError                  any failed call (code, reason, message, metadata, retry_delay)
    ├── InvalidRequestError         INVALID_ARGUMENT (INVALID_REQUEST, PROMPT_TOO_LARGE, ...)
    ├── NotFoundError               NOT_FOUND (MODEL_NOT_FOUND, BACKEND_NOT_FOUND)
    ├── AuthenticationError         UNAUTHENTICATED
    ├── PermissionDeniedError       PERMISSION_DENIED
    ├── FailedPreconditionError     FAILED_PRECONDITION (a refused reload: CONFIG_INVALID, CONFIG_NEEDS_RESTART)
    ├── AlreadyExistsError          ALREADY_EXISTS (REQUEST_ID_IN_USE)
    ├── ResourceExhaustedError      RESOURCE_EXHAUSTED (QUEUE_FULL, QUEUE_BYTES_FULL, BACKEND_OVERLOADED)
    ├── DeadlineExceededError       DEADLINE_EXCEEDED (QUEUE_TIMEOUT, or the call's own deadline)
    ├── UnavailableError            UNAVAILABLE (SHUTTING_DOWN, BACKEND_UNAVAILABLE, or no connection)
    └── InternalError               INTERNAL and anything else

Whether a retry may help is the error table's answer for the reason (`llmsched.v1.errors`); an error
without a reason this client knows (a transport failure, a deadline) is not retryable.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from llmsched.v1.errors import ERROR_DOMAIN
from llmsched.v1.errors import is_retryable as _reason_is_retryable

_STATUS_DETAILS_KEY = "grpc-status-details-bin"


class SchedulerError(Exception):
    """A call the scheduler (or the transport) failed: its gRPC `code`, the `reason` from the error table
    (None when the status carried none), the `message`, ErrorInfo's `metadata`, and RetryInfo's
    `retry_delay` in seconds (None when not sent)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str | None = None,
        metadata: dict[str, str] | None = None,
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(f"{code.name}{f' ({reason})' if reason else ''}: {message}")
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = metadata or {}
        self.retry_delay = retry_delay

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed when sent again (after `retry_delay` when given)."""
        return _reason_is_retryable(self.reason)


class InvalidRequestError(SchedulerError):
    """The request is wrong (a field, its size, or the engine refused it): do not send it again as is."""


class NotFoundError(SchedulerError):
    """The model (or, for an admin call, the backend) is not configured."""


class AuthenticationError(SchedulerError):
    """No valid caller identity (API key or user id)."""


class PermissionDeniedError(SchedulerError):
    """The caller may not do this."""


class FailedPreconditionError(SchedulerError):
    """The service refused a reload of its configuration file, which it keeps running: the message says why."""


class AlreadyExistsError(SchedulerError):
    """A live request of the caller has this request id."""


class ResourceExhaustedError(SchedulerError):
    """A queue cap was hit or the engine refused for load: come back after `retry_delay`."""


class DeadlineExceededError(SchedulerError):
    """The call's deadline (or the class's queue TTL) passed."""


class UnavailableError(SchedulerError):
    """The instance is draining, the engine is unreachable, or the scheduler could not be reached."""


class InternalError(SchedulerError):
    """A failure between the scheduler and the engine, or a bug."""


_C = grpc.StatusCode
_CLASSES: dict[grpc.StatusCode, type[SchedulerError]] = {
    _C.INVALID_ARGUMENT: InvalidRequestError,
    _C.NOT_FOUND: NotFoundError,
    _C.UNAUTHENTICATED: AuthenticationError,
    _C.PERMISSION_DENIED: PermissionDeniedError,
    _C.FAILED_PRECONDITION: FailedPreconditionError,
    _C.ALREADY_EXISTS: AlreadyExistsError,
    _C.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    _C.DEADLINE_EXCEEDED: DeadlineExceededError,
    _C.UNAVAILABLE: UnavailableError,
}


def _status_details(trailing: Iterable[Any] | None) -> list[Any]:
    """The google.rpc.Status details packed in the trailing metadata (sync and asyncio calls alike)."""
    for key, value in trailing or ():
        if key == _STATUS_DETAILS_KEY and isinstance(value, bytes):
            status = status_pb2.Status()
            status.ParseFromString(value)
            return list(status.details)
    return []


def from_rpc_error(error: grpc.RpcError) -> SchedulerError:
    """The typed error for a failed call (a `grpc.RpcError` that is also a `grpc.Call`, or an AioRpcError)."""
    code: grpc.StatusCode = error.code()
    message: str = error.details() or ""
    reason: str | None = None
    metadata: dict[str, str] = {}
    retry_delay: float | None = None
    for detail in _status_details(error.trailing_metadata()):
        info = error_details_pb2.ErrorInfo()
        retry = error_details_pb2.RetryInfo()
        if detail.Is(info.DESCRIPTOR) and detail.Unpack(info) and info.domain == ERROR_DOMAIN:
            reason, metadata = str(info.reason), dict(info.metadata)
        elif detail.Is(retry.DESCRIPTOR) and detail.Unpack(retry):
            retry_delay = retry.retry_delay.ToNanoseconds() / 1e9
    cls = _CLASSES.get(code, InternalError)
    return cls(code, message, reason=reason, metadata=metadata, retry_delay=retry_delay)

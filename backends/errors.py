"""Errors raised by engine adapters.

    BackendError                  any failure talking to an engine
    ├── BackendUnavailable        engine unreachable, connection dropped, HTTP 5xx/503   -> UNAVAILABLE
    ├── BackendOverloaded         engine refused for load (HTTP 429, TGI "overloaded")   -> RESOURCE_EXHAUSTED
    ├── BackendRejectedRequest    engine says the request is invalid (HTTP 400/422)      -> INVALID_ARGUMENT
    └── BackendProtocolError      engine answered something we cannot parse             -> INTERNAL

Each class knows its gRPC status code; `scheduler_svc.errors` is the one place that turns exceptions
into gRPC statuses.
"""

from __future__ import annotations

from typing import ClassVar

import grpc


class BackendError(Exception):
    """Base class: something went wrong between us and the engine."""

    status_code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL
    reason: ClassVar[str] = "BACKEND_ERROR"

    def __init__(self, message: str, *, backend: str = "") -> None:
        super().__init__(message)
        self.backend = backend


class BackendUnavailable(BackendError):
    """The engine could not be reached or dropped the connection mid-stream."""

    status_code = grpc.StatusCode.UNAVAILABLE
    reason = "BACKEND_UNAVAILABLE"


class BackendOverloaded(BackendError):
    """The engine refused the request because it is full."""

    status_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "BACKEND_OVERLOADED"


class BackendRejectedRequest(BackendError):
    """The engine considers the request invalid (e.g. prompt longer than the context)."""

    status_code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "BACKEND_REJECTED_REQUEST"


class BackendProtocolError(BackendError):
    """The engine answered in a shape we do not understand."""

    status_code = grpc.StatusCode.INTERNAL
    reason = "BACKEND_PROTOCOL_ERROR"

"""Errors raised by engine adapters: the backend port's own exceptions, neutral to any wire protocol.

    BackendError                  any failure talking to an engine
    ├── BackendUnavailable        engine unreachable, connection dropped, HTTP 5xx/503
    ├── BackendOverloaded         engine refused for load (HTTP 429, TGI "overloaded")
    ├── BackendRejectedRequest    engine says the request is invalid (HTTP 400/422)
    └── BackendProtocolError      engine answered something we cannot parse

Each class carries a machine-readable `reason`; which status a client sees is the face's business
(`scheduler_svc.grpc.status` for gRPC), so adapters know nothing of the service.
"""

from __future__ import annotations

from typing import ClassVar


class BackendError(Exception):
    """Base class: something went wrong between us and the engine."""

    reason: ClassVar[str] = "BACKEND_ERROR"

    def __init__(self, message: str, *, backend: str = "") -> None:
        super().__init__(message)
        self.backend = backend


class BackendUnavailable(BackendError):
    """The engine could not be reached or dropped the connection mid-stream."""

    reason = "BACKEND_UNAVAILABLE"


class BackendOverloaded(BackendError):
    """The engine refused the request because it is full."""

    reason = "BACKEND_OVERLOADED"


class BackendRejectedRequest(BackendError):
    """The engine considers the request invalid (e.g. prompt longer than the context)."""

    reason = "BACKEND_REJECTED_REQUEST"


class BackendProtocolError(BackendError):
    """The engine answered in a shape we do not understand."""

    reason = "BACKEND_PROTOCOL_ERROR"

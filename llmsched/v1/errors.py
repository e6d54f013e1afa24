"""The error table of llmsched.v1: for each `ErrorReason`, its gRPC code, HTTP status and whether a retry may
succeed. Every face (the gRPC servicer, an HTTP front door) and every client follows it.

It is the one source: `scripts/gen_docs.py` writes it into docs/api.md as a table, and tests check that it
covers exactly the `ErrorReason` values of error_reason.proto, that each value's comment there says the
same, and that every reason the service sends is here with the code the service sends it with.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

ERROR_DOMAIN = "llmsched.v1"
"""`google.rpc.ErrorInfo.domain` on every error status of the service."""


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """How one reason travels: the gRPC status code, the HTTP status an HTTP face answers with, and whether
    the same request may succeed when sent again later (after `google.rpc.RetryInfo`'s delay when given)."""

    code: grpc.StatusCode
    http_status: int
    retryable: bool
    meaning: str


_C = grpc.StatusCode

ERRORS: dict[str, ErrorSpec] = {
    "INVALID_REQUEST": ErrorSpec(_C.INVALID_ARGUMENT, 400, False, "a field is missing or out of range"),
    "MALFORMED_REQUEST": ErrorSpec(_C.INVALID_ARGUMENT, 400, False, "the body does not decode (e.g. bad UTF-8)"),
    "PROMPT_TOO_LARGE": ErrorSpec(_C.INVALID_ARGUMENT, 413, False, "prompt, messages and stop over max_prompt_bytes"),
    "MODEL_NOT_FOUND": ErrorSpec(_C.NOT_FOUND, 404, False, "the model is not configured"),
    "UNAUTHENTICATED": ErrorSpec(_C.UNAUTHENTICATED, 401, False, "no valid caller identity"),
    "PERMISSION_DENIED": ErrorSpec(_C.PERMISSION_DENIED, 403, False, "the caller may not do this"),
    "REQUEST_ID_IN_USE": ErrorSpec(_C.ALREADY_EXISTS, 409, False, "a live request of the caller has this id"),
    "QUEUE_FULL": ErrorSpec(_C.RESOURCE_EXHAUSTED, 429, True, "a request-count cap was hit (RetryInfo)"),
    "QUEUE_BYTES_FULL": ErrorSpec(_C.RESOURCE_EXHAUSTED, 429, True, "a prompt-byte cap was hit (RetryInfo)"),
    "QUEUE_TIMEOUT": ErrorSpec(_C.DEADLINE_EXCEEDED, 504, False, "the deadline or queue TTL passed while queued"),
    "SHUTTING_DOWN": ErrorSpec(_C.UNAVAILABLE, 503, True, "the instance is draining: retry on another"),
    "BACKEND_UNAVAILABLE": ErrorSpec(_C.UNAVAILABLE, 503, True, "the engine is unreachable or dropped the stream"),
    "BACKEND_OVERLOADED": ErrorSpec(_C.RESOURCE_EXHAUSTED, 429, True, "the engine refused for load"),
    "BACKEND_REJECTED_REQUEST": ErrorSpec(_C.INVALID_ARGUMENT, 400, False, "the engine refused the request"),
    "BACKEND_PROTOCOL_ERROR": ErrorSpec(_C.INTERNAL, 502, False, "the engine answered something unparsable"),
    "BACKEND_ERROR": ErrorSpec(_C.INTERNAL, 502, False, "any other failure between us and the engine"),
    "INTERNAL": ErrorSpec(_C.INTERNAL, 500, False, "a bug of ours"),
    "READ_TIMEOUT": ErrorSpec(_C.DEADLINE_EXCEEDED, 408, True, "HTTP: the request's headers or body came too slowly"),
    "READ_CAPACITY_FULL": ErrorSpec(_C.UNAVAILABLE, 503, True, "HTTP: too many body bytes being read at once"),
    "DEADLINE_EXCEEDED": ErrorSpec(
        _C.DEADLINE_EXCEEDED, 504, False, "the call's deadline passed before admission or while running"
    ),
    "BACKEND_NOT_FOUND": ErrorSpec(_C.NOT_FOUND, 404, False, "admin: no backend of that name"),
    "CONFIG_INVALID": ErrorSpec(_C.FAILED_PRECONDITION, 400, False, "admin: the config file does not load"),
    "CONFIG_NEEDS_RESTART": ErrorSpec(
        _C.FAILED_PRECONDITION, 400, False, "admin: the file changes what only a restart changes"
    ),
    "UNSUPPORTED_CONTENT_TYPE": ErrorSpec(_C.INVALID_ARGUMENT, 415, False, "HTTP: the body's Content-Type is not JSON"),
}
"""Reason (an `ErrorReason` value name, sent as `ErrorInfo.reason`) -> how it travels."""


def is_retryable(reason: str | None) -> bool:
    """Whether a request that failed with `reason` may succeed when sent again; unknown reasons never do."""
    spec = ERRORS.get(reason or "")
    return spec is not None and spec.retryable


def describe(spec: ErrorSpec) -> str:
    """The one-line summary that error_reason.proto's comment on the value starts with."""
    retry = "retryable" if spec.retryable else "not retryable"
    return f"gRPC {spec.code.name}, HTTP {spec.http_status}, {retry}"


def markdown_table() -> str:
    """The error table of docs/api.md, rendered from `ERRORS`."""
    lines = ["| reason | gRPC code | HTTP status | retryable | meaning |", "| --- | --- | --- | --- | --- |"]
    for reason, spec in ERRORS.items():
        retry = "yes" if spec.retryable else "no"
        lines.append(f"| `{reason}` | {spec.code.name} | {spec.http_status} | {retry} | {spec.meaning} |")
    return "\n".join(lines) + "\n"

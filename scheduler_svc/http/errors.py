"""The HTTP door's error mapping: exceptions to OpenAI's error shape, by the one table in llmsched.v1.errors.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "logprobs", "code": "invalid_request"}}

The HTTP status comes from the reason's row of `llmsched.v1.errors.ERRORS` (the gRPC face reads the same
rows), `code` is the reason in lower case, `type` is OpenAI's class of the status. Headers:
- `x-should-retry`: the table's `retryable`. The official SDKs retry 408, 409, 429 and 5xx on their own
  unless told `false`: a duplicate request id or a queue timeout would only fail again.
- 429 from a queue cap: `Retry-After` (whole seconds, rounded up) and `retry-after-ms`, from the same hint
  gRPC sends as RetryInfo.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from backends.errors import BackendError
from llmsched.v1.errors import ERRORS
from scheduler_svc.core.errors import InvalidField, QueueFull, SchedulerError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """One error as the HTTP door sends it: status, headers and the OpenAI-shaped body."""

    status: int
    headers: dict[str, str]
    body: dict[str, Any]


def error_reply(exc: BaseException) -> ErrorReply:
    """Map any exception to its reply; anything that is not ours or the backend's is INTERNAL (500)."""
    if isinstance(exc, (SchedulerError, BackendError)):
        reason, message = exc.reason, str(exc)
    else:
        reason, message = "INTERNAL", f"internal error: {type(exc).__name__}"
    spec = ERRORS.get(reason, ERRORS["INTERNAL"])
    headers = {"x-should-retry": "true" if spec.retryable else "false"}
    if isinstance(exc, QueueFull):
        delay = max(0.0, exc.retry_after_seconds)
        headers["retry-after"] = str(max(1, math.ceil(delay)))
        headers["retry-after-ms"] = str(round(delay * 1000))
    error = {
        "message": message,
        "type": _TYPES.get(spec.http_status, "server_error"),
        "param": exc.param if isinstance(exc, InvalidField) else None,
        "code": reason.lower(),
    }
    return ErrorReply(spec.http_status, headers, {"error": error})

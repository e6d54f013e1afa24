"""Python clients for llm-scheduler.

`AsyncClient` (asyncio) and `Client` (blocking) share one surface: `submit` returns a `Completion`,
`stream` an iterator of typed events (`Queued`, `Dispatched`, `Delta`, `Finished`, in the order of the
Stream contract), failures raise a typed `SchedulerError`, retries honour RetryInfo (never after a token)
within the call's deadline. `SchedulerClient` is the raw layer under them: protobuf messages and gRPC
errors, no retries (tests and benchmarks that look at the wire use it). Admins also reload the service's
configuration (`reload_config`) and drain backends (`drain_backend`, `undrain_backend`).
"""

from clients._connection import channel_credentials
from clients.aio import AsyncClient, AsyncEventStream
from clients.client import SchedulerClient, error_reason, is_retryable, retry_delay
from clients.errors import (
    AlreadyExistsError,
    AuthenticationError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    SchedulerError,
    UnavailableError,
    from_rpc_error,
)
from clients.events import Completion, Delta, Dispatched, Event, Finished, Queued, Timings
from clients.retry import NO_RETRY, RetryAttempt, RetryPolicy
from clients.sync import Client, EventStream
from llmsched.v1 import scheduler_pb2 as pb
from llmsched.v1 import scheduler_pb2_grpc as pb_grpc

__all__ = [
    "NO_RETRY",
    "AlreadyExistsError",
    "AsyncClient",
    "AsyncEventStream",
    "AuthenticationError",
    "Client",
    "Completion",
    "DeadlineExceededError",
    "Delta",
    "Dispatched",
    "Event",
    "EventStream",
    "FailedPreconditionError",
    "Finished",
    "InternalError",
    "InvalidRequestError",
    "NotFoundError",
    "PermissionDeniedError",
    "Queued",
    "ResourceExhaustedError",
    "RetryAttempt",
    "RetryPolicy",
    "SchedulerClient",
    "SchedulerError",
    "Timings",
    "UnavailableError",
    "channel_credentials",
    "error_reason",
    "from_rpc_error",
    "is_retryable",
    "pb",
    "pb_grpc",
    "retry_delay",
]

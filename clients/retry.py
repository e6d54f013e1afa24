"""When to send a failed request again, and how long to wait first; shared by the sync and asyncio clients.

A request is retried only when all of these hold:
- the error table says its reason is retryable (`llmsched.v1.errors`; no reason: never);
- it produced no tokens (a stream retries only before its first `Delta`; a unary Submit cannot tell when a
  later failure happened, so it retries only refusals at admission, which come before any token);
- attempts are left, and the wait fits in the caller's deadline: a retry never extends it, it only gets
  what is left of it.

The wait is the server's `RetryInfo` delay when it sent one (never less), else exponential backoff; jitter
adds up to `jitter` of it at random so clients refused together do not come back together.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from clients.errors import DeadlineExceededError, SchedulerError

ADMISSION_REFUSALS = frozenset({"QUEUE_FULL", "QUEUE_BYTES_FULL"})
"""Reasons given before a request is queued, so before it can have produced a token."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many attempts a call may make and how long to wait between them."""

    max_attempts: int = 3  # in all, the first included (1: never retry)
    initial_backoff: float = 0.1  # seconds, the first wait when the server sent no RetryInfo
    max_backoff: float = 5.0  # cap of the exponential backoff (not of a RetryInfo delay)
    multiplier: float = 2.0
    jitter: float = 0.2  # up to this fraction of the wait is added at random
    max_retry_delay: float = 60.0  # a server asking for a longer wait gets the error raised instead

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.jitter < 0 or self.initial_backoff < 0 or self.multiplier < 1:
            raise ValueError("jitter and initial_backoff must be >= 0 and multiplier >= 1")


NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass(frozen=True, slots=True)
class RetryAttempt:
    """What `on_retry` hears before each retry: the attempt about to be made (2 for the first retry), the
    wait before it in seconds, and the error that made it necessary."""

    attempt: int
    delay: float
    error: SchedulerError


class Deadline:
    """A call's overall deadline on the monotonic clock (None: none), which every attempt shares."""

    def __init__(self, timeout: float | None = None, deadline: float | None = None) -> None:
        if timeout is not None and deadline is not None:
            raise ValueError("give timeout (seconds from now) or deadline (time.monotonic() value), not both")
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be positive")
        self.at = time.monotonic() + timeout if timeout is not None else deadline

    def remaining(self) -> float | None:
        """Seconds left, for the next attempt's gRPC deadline; raises DeadlineExceededError when none are."""
        if self.at is None:
            return None
        left = self.at - time.monotonic()
        if left <= 0:
            raise DeadlineExceededError(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed")
        return left


class Retrier:
    """One call's retry bookkeeping."""

    def __init__(
        self,
        policy: RetryPolicy,
        deadline: Deadline,
        on_retry: Callable[[RetryAttempt], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy
        self.deadline = deadline
        self.attempt = 1
        self._on_retry = on_retry
        self._rng = rng or random.Random()

    def next_delay(self, error: SchedulerError, *, produced_tokens: bool, unary: bool = False) -> float | None:
        """The wait before sending the request again, or None when it must not be sent again."""
        policy = self.policy
        if produced_tokens or not error.retryable or self.attempt >= policy.max_attempts:
            return None
        if unary and error.reason not in ADMISSION_REFUSALS:
            return None
        if error.retry_delay is not None:
            if error.retry_delay > policy.max_retry_delay:
                return None
            base = error.retry_delay
        else:
            base = min(policy.max_backoff, policy.initial_backoff * policy.multiplier ** (self.attempt - 1))
        delay = base * (1 + self._rng.uniform(0, policy.jitter))
        if self.deadline.at is not None and time.monotonic() + delay >= self.deadline.at:
            return None  # the retry could not finish in time: the caller hears the real error now
        self.attempt += 1
        if self._on_retry is not None:
            self._on_retry(RetryAttempt(self.attempt, delay, error))
        return delay


@dataclass(frozen=True, slots=True)
class CallDefaults:
    """What a client applies to each of its calls (the sync and asyncio clients alike): its overall timeout
    when the call names no deadline of its own, and its retry policy."""

    timeout: float | None = None
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    on_retry: Callable[[RetryAttempt], None] | None = None

    def retrier(self, timeout: float | None, deadline: float | None) -> Retrier:
        """One call's retry bookkeeping, under the call's own `timeout` or `deadline`, else the client's."""
        if timeout is None and deadline is None:
            timeout = self.timeout
        return Retrier(self.policy, Deadline(timeout, deadline), self.on_retry)

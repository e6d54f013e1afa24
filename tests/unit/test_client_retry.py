"""The client's retry rule on its own: the error table, tokens, attempts, RetryInfo with jitter, deadline."""

from __future__ import annotations

import random
import time

import grpc
import pytest

from clients import ResourceExhaustedError, RetryPolicy, SchedulerError, UnavailableError
from clients.retry import Deadline, Retrier


def _full(delay: float | None = 0.5) -> SchedulerError:
    return ResourceExhaustedError(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", reason="QUEUE_FULL", retry_delay=delay)


def _retrier(timeout: float | None = None, seed: int = 7, policy: RetryPolicy | None = None) -> Retrier:
    return Retrier(RetryPolicy() if policy is None else policy, Deadline(timeout), rng=random.Random(seed))


def test_retry_info_is_a_floor_and_jitter_only_adds() -> None:
    delays = [_retrier(seed=i).next_delay(_full(0.5), produced_tokens=False) for i in range(50)]
    assert all(d is not None and 0.5 <= d <= 0.5 * 1.2 for d in delays)
    assert len(set(delays)) > 1


def test_no_retry_after_tokens_for_unknown_reasons_or_past_the_attempts() -> None:
    assert _retrier().next_delay(_full(), produced_tokens=True) is None
    unknown = UnavailableError(grpc.StatusCode.UNAVAILABLE, "no connection")  # no reason: not retryable
    assert _retrier().next_delay(unknown, produced_tokens=False) is None
    retrier = _retrier(policy=RetryPolicy(max_attempts=2))
    assert retrier.next_delay(_full(), produced_tokens=False) is not None
    assert retrier.next_delay(_full(), produced_tokens=False) is None


def test_a_unary_call_retries_only_refusals_at_admission() -> None:
    dropped = UnavailableError(grpc.StatusCode.UNAVAILABLE, "dropped", reason="BACKEND_UNAVAILABLE")
    assert _retrier().next_delay(dropped, produced_tokens=False, unary=True) is None
    assert _retrier().next_delay(dropped, produced_tokens=False) is not None
    assert _retrier().next_delay(_full(), produced_tokens=False, unary=True) is not None


def test_a_wait_past_the_deadline_is_no_retry_and_the_deadline_is_shared() -> None:
    assert _retrier(timeout=0.3).next_delay(_full(0.5), produced_tokens=False) is None
    deadline = Deadline(timeout=10.0)
    first = deadline.remaining()
    assert first is not None and first <= 10.0
    assert Deadline(deadline=time.monotonic() + 1.0).remaining() is not None
    with pytest.raises(ValueError):
        Deadline(timeout=1.0, deadline=time.monotonic())

"""The dispatcher's parts alone: capacity and retry hints, the failover rule, the position notifier.
Fake clock and plain objects, no dispatcher, no sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from backends.base import BackendCapabilities, SamplingParams
from backends.errors import BackendError, BackendOverloaded, BackendUnavailable
from backends.fake import FakeBackend
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.config import ModelConfig
from scheduler_svc.core.errors import QueueBytesFull, QueueFull
from scheduler_svc.core.queues import Flow, ModelQueues
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.dispatch.capacity import MAX_RETRY_SECONDS, UNKNOWN_RATE_RETRY_SECONDS, Capacity, retry_after
from scheduler_svc.dispatch.failover import FailoverRule
from scheduler_svc.dispatch.load import LoadEstimator
from scheduler_svc.dispatch.positions import PositionNotifier
from tests.unit.dispatch_harness import CapGate


def model(**fields: Any) -> tuple[ModelConfig, ModelQueues]:
    config = config_from_dict({"models": [{"name": "m", **fields, "backends": [{"name": "b0"}]}]})
    return config.models[0], ModelQueues(config.scheduling.classes)


def request(rid: str, user: str = "u", prompt_bytes: int = 10, deadline: float | None = None) -> QueuedRequest:
    return QueuedRequest(
        request_id=rid,
        model="m",
        user=user,
        priority_class="interactive",
        prompt="p",
        messages=None,
        params=SamplingParams(),
        admitted_at=0.0,
        deadline=deadline,
        prompt_bytes=prompt_bytes,
    )


# -- capacity ------------------------------------------------------------------------------------------
def test_retry_hint_is_a_tenth_of_the_backlog_at_the_rate_within_bounds() -> None:
    assert retry_after(100, 5.0) == 2.0
    assert retry_after(3, 5.0) == 0.2  # at least one request's time
    assert retry_after(1, 1000.0) == 0.1  # never below the minimum
    assert retry_after(10**9, 1.0) == MAX_RETRY_SECONDS
    assert retry_after(100, 0.0) == UNKNOWN_RATE_RETRY_SECONDS


def test_capacity_refuses_past_the_count_caps_with_a_hint() -> None:
    config, queues = model(max_queued=3, max_queued_per_user=2)
    capacity = Capacity(config, queues)
    for rid, user in (("a1", "a"), ("a2", "a")):
        capacity.check(request(rid, user), busy=0, rate=0.0)
        queues.push(request(rid, user))
    with pytest.raises(QueueFull, match="user a has 2 requests queued") as per_user:
        capacity.check(request("a3", "a"), busy=2, rate=10.0)
    assert per_user.value.retry_after_seconds == 0.1  # 2 queued, 10/s shared by one backlogged user
    queues.push(request("b1", "b"))
    with pytest.raises(QueueFull, match="has 3 requests queued") as model_full:
        capacity.check(request("c1", "c"), busy=3, rate=0.0)
    assert model_full.value.retry_after_seconds == UNKNOWN_RATE_RETRY_SECONDS


def test_capacity_holds_prompt_bytes_until_released() -> None:
    config, queues = model(max_queued_bytes=100, max_queued_bytes_per_user=60)
    capacity = Capacity(config, queues)
    capacity.hold(request("a1", "a", prompt_bytes=50))
    with pytest.raises(QueueBytesFull, match="user a holds 50 prompt bytes"):
        capacity.check(request("a2", "a", prompt_bytes=20), busy=1, rate=0.0)
    capacity.hold(request("b1", "b", prompt_bytes=40))
    with pytest.raises(QueueBytesFull, match="model m holds 90 prompt bytes"):
        capacity.check(request("c1", "c", prompt_bytes=20), busy=2, rate=0.0)
    capacity.release(request("a1", "a", prompt_bytes=50))
    capacity.check(request("a2", "a", prompt_bytes=20), busy=1, rate=0.0)
    assert capacity.held_bytes == 40 and capacity.user_bytes("a") == 0 and capacity.user_bytes("b") == 40


# -- failover ------------------------------------------------------------------------------------------
def test_failover_retries_availability_errors_within_attempts_and_deadline() -> None:
    config, _ = model(failover_attempts=1, failover_cooldown_seconds=2.0)
    rule = FailoverRule(config)
    live = request("r", deadline=10.0)
    assert rule.may_retry(live, BackendUnavailable("refused"), attempts=1, now=5.0)
    assert rule.may_retry(live, BackendOverloaded("busy"), attempts=1, now=5.0)
    assert not rule.may_retry(live, BackendUnavailable("refused"), attempts=2, now=5.0)  # used its attempts
    assert not rule.may_retry(live, BackendUnavailable("refused"), attempts=1, now=10.0)  # deadline passed
    assert not rule.may_retry(live, BackendError("bad request"), attempts=1, now=5.0)  # about the request
    backend = FakeBackend(lambda _: None, capabilities=BackendCapabilities())  # type: ignore[arg-type, return-value]
    handle = BackendHandle(config.backends[0], backend, CapGate(1), LoadEstimator())
    rule.cool_down(handle, 5.0)
    assert handle.cooling_for(6.0) == 1.0 and handle.cooling_for(7.0) == 0.0


# -- positions -----------------------------------------------------------------------------------------
class Waiter:
    def __init__(self, watches: bool = True) -> None:
        self.watches_position = watches
        self.nudges = 0

    def nudge(self) -> None:
        self.nudges += 1


def test_the_notifier_nudges_watchers_of_moved_flows_only_once_per_pass() -> None:
    moved, still = Flow("a", "interactive"), Flow("b", "interactive")
    for rid, flow in (("a1", moved), ("a2", moved), ("b1", still)):
        flow.push(request(rid, flow.user))
    waiters = {"a1": Waiter(), "a2": Waiter(watches=False), "b1": Waiter()}
    notifier = PositionNotifier(waiters)
    notifier.moved(moved)
    notifier.moved(moved)
    assert notifier.notify() == 1
    assert (waiters["a1"].nudges, waiters["a2"].nudges, waiters["b1"].nudges) == (1, 0, 0)
    assert notifier.notify() == 0  # nothing moved since


async def test_the_notifier_loop_wakes_on_a_move() -> None:
    flow = Flow("a", "interactive")
    flow.push(request("a1", "a"))
    waiter = Waiter()
    notifier = PositionNotifier({"a1": waiter})
    loop = asyncio.create_task(notifier.run(0.0))
    try:
        notifier.moved(flow)
        for _ in range(100):
            if waiter.nudges:
                break
            await asyncio.sleep(0)
        assert waiter.nudges == 1
    finally:
        loop.cancel()

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
from scheduler_svc.dispatch.capacity import (
    MAX_RETRY_SECONDS,
    UNKNOWN_RETRY_SECONDS,
    Capacity,
    DispatchEta,
    dispatch_eta,
    retry_hint,
)
from scheduler_svc.dispatch.failover import FailoverRule
from scheduler_svc.dispatch.load import LoadEstimator
from scheduler_svc.dispatch.positions import PositionNotifier
from tests.unit.dispatch_harness import CapGate, Harness, never_generates


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


def no_estimate(needed: int, priority_class: str) -> float | None:
    return None


# -- capacity ------------------------------------------------------------------------------------------
def test_dispatch_eta_is_the_later_of_the_drain_rate_and_running_requests_ending() -> None:
    assert dispatch_eta(10, 5.0, None) == 2.0  # engines can take more: the rate alone
    assert dispatch_eta(1, 0.0, None) is None  # nothing known
    # Engines full: not before running requests end, whatever the recent rate.
    assert dispatch_eta(1, 100.0, [80.0, 90.0]) == 80.0
    assert dispatch_eta(2, 100.0, [80.0, 90.0]) == 90.0
    assert dispatch_eta(4, 100.0, [80.0, 90.0]) == 180.0  # two waves of the longest
    assert dispatch_eta(30, 0.1, [1.0, 2.0]) == 300.0  # the rate is the later here
    assert dispatch_eta(3, 0.0, [5.0]) == 15.0


def test_retry_hint_is_the_estimate_within_the_floor_and_the_ceiling() -> None:
    assert retry_hint(2.5, floor=1.0) == 2.5
    assert retry_hint(0.2, floor=1.0) == 1.0  # never below the floor
    assert retry_hint(None, floor=0.5) == UNKNOWN_RETRY_SECONDS
    assert retry_hint(10.0**9, floor=1.0) == MAX_RETRY_SECONDS


def test_capacity_refuses_past_the_count_caps_with_a_hint() -> None:
    config, queues = model(max_queued=3, max_queued_per_user=2, min_retry_after_seconds=0.1)
    capacity = Capacity(config, queues)
    asked: list[tuple[int, str]] = []

    def at_rate(rate: float) -> DispatchEta:
        def eta(needed: int, priority_class: str) -> float | None:
            asked.append((needed, priority_class))
            return dispatch_eta(needed, rate, None)

        return eta

    for rid, user in (("a1", "a"), ("a2", "a")):
        capacity.check(request(rid, user), busy=0, eta=at_rate(0.0))
        queues.push(request(rid, user))
    with pytest.raises(QueueFull, match="user a has 2 requests queued") as per_user:
        capacity.check(request("a3", "a"), busy=2, eta=at_rate(10.0))
    assert per_user.value.retry_after_seconds == 0.1  # one dispatch for its one backlogged user, at 10/s
    queues.push(request("b1", "b"))
    with pytest.raises(QueueFull, match="has 3 requests queued") as model_full:
        capacity.check(request("c1", "c"), busy=3, eta=at_rate(0.0))
    assert model_full.value.retry_after_seconds == UNKNOWN_RETRY_SECONDS
    assert asked[-1] == (1, "interactive")


def test_a_full_queue_behind_long_answers_hints_when_they_end_not_the_recent_rate() -> None:
    """Every slot held by 80-second answers and a burst just dispatched: the hint is when the first of them
    ends (not 0.2 s from the burst's rate, which the SDKs' two retries spent in half a second)."""
    h = Harness(model={"max_queued_per_user": 2, "max_tokens_limit": 4000}, cap=2)
    for _ in range(2):
        h.submit("long", max_tokens=2000)
    h.dispatch()  # both slots taken, within the same second: a high recent rate
    h.reading(running=2, tpot=0.04)  # 2000 tokens at 40 ms: 80 s each
    h.step(0.04)  # a first token each
    for _ in range(2):
        h.submit("u")
    with pytest.raises(QueueFull) as full:
        h.submit("u")
    assert full.value.retry_after_seconds == pytest.approx(1999 * 0.04)
    # The queued requests' own estimate: the same ends, nothing shown as 0.
    ticket = next(t for t in h.tickets.values() if t.request.user == "u")
    assert h.dispatcher.outlook(ticket).estimated_wait == pytest.approx(1999 * 0.04)
    # Nothing dispatched lately and nothing running: no estimate (the queue line leaves eta out).
    idle = Harness(cap=0)
    assert idle.dispatcher.outlook(idle.submit("u")).estimated_wait is None


def test_capacity_holds_prompt_bytes_until_released() -> None:
    config, queues = model(max_queued_bytes=100, max_queued_bytes_per_user=60)
    capacity = Capacity(config, queues)
    capacity.hold(request("a1", "a", prompt_bytes=50))
    with pytest.raises(QueueBytesFull, match="user a holds 50 prompt bytes"):
        capacity.check(request("a2", "a", prompt_bytes=20), busy=1, eta=no_estimate)
    capacity.hold(request("b1", "b", prompt_bytes=40))
    with pytest.raises(QueueBytesFull, match="model m holds 90 prompt bytes"):
        capacity.check(request("c1", "c", prompt_bytes=20), busy=2, eta=no_estimate)
    capacity.release(request("a1", "a", prompt_bytes=50))
    capacity.check(request("a2", "a", prompt_bytes=20), busy=1, eta=no_estimate)
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
    backend = FakeBackend(never_generates, capabilities=BackendCapabilities())
    handle = BackendHandle(config.backends[0], backend, CapGate(1), LoadEstimator())
    rule.cool_down(handle, 5.0)
    assert handle.cooling_for(6.0) == 1.0 and handle.cooling_for(7.0) == 0.0


def test_the_loop_passes_again_when_a_cooldown_ends_while_requests_wait() -> None:
    """A backend's cooldown ends by time alone; no event marks it, so the loop's own timer must."""
    h = Harness(model={"failover_cooldown_seconds": 2.0})
    h.handle.cool_until = h.clock.now() + 2.0  # a failover's cooldown, as the failover rule sets it
    ticket = h.submit("alice")
    assert h.dispatch() == []  # its only backend cools down
    assert h.dispatcher.loop.choose_again_at() == h.clock.now() + 2.0  # armed for the cooldown's end
    h.clock.advance(2.0)
    assert h.dispatch() == [ticket]
    assert h.dispatcher.loop.choose_again_at() is None  # nothing waits: no timer
    h.handle.cool_until = h.clock.now() + 1.0
    assert h.dispatcher.loop.choose_again_at() is None, "nothing queued: a cooldown's end wakes nobody"


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

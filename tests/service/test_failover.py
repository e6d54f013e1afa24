"""Failover: a request a backend fails before its first token goes back to the head of its queue and is
sent again, to another backend while the failed one cools down. Real gRPC over a socket."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any

import grpc
import pytest

from backends.base import Backend, GenerationEvent, GenerationRequest, SamplingParams, TextDelta
from backends.errors import BackendError, BackendRejectedRequest, BackendUnavailable
from backends.fake import FakeBackend
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.config import BackendConfig, Config, ModelConfig, PriorityClassConfig
from scheduler_svc.core.queues import ModelQueues
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.core.ticket import Outcome, TicketState
from tests.helpers import ControlledEngine, client_for, outcome_count, serving, until_settled
from tests.stream_events import next_event
from tests.unit.dispatch_harness import Harness


def two_backends(**model: Any) -> Config:
    """Model "m" on backends b0 (listed first, so chosen first when both are idle) and b1."""
    backends = [
        {"name": name, "kind": "vllm", "url": "http://127.0.0.1:1", "scrape_interval_seconds": 0.05}
        for name in ("b0", "b1")
    ]
    return config_from_dict(
        {
            "server": {"listen": "127.0.0.1:0", "metrics_listen": "127.0.0.1:0"},
            "models": [{"name": "m", "default_max_tokens": 16, "backends": backends, **model}],
        }
    )


def failing(error: BackendError, after_tokens: int = 0, name: str = "b0") -> FakeBackend:
    """A backend whose every generation fails with `error`, after `after_tokens` tokens."""

    async def generate(request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        for i in range(after_tokens):
            yield TextDelta(f"t{i}")
        raise error

    return FakeBackend(generate, name=name)


def factory(b0: FakeBackend, b1: Backend) -> Callable[[ModelConfig, BackendConfig], Backend]:
    return lambda model, backend: b0 if backend.name == "b0" else b1


def failovers(server: Any, backend: str = "b0") -> float:
    value = server.scheduler.metrics.registry.get_sample_value(
        "llmsched_requests_failed_over_total", {"model": "m", "backend": backend}
    )
    return value or 0.0


async def test_a_request_an_engine_cannot_take_completes_on_the_other_backend() -> None:
    b0, engine = failing(BackendUnavailable("connection refused")), ControlledEngine(auto_release=True)
    async with serving(two_backends(), factory(b0, engine.backend("b1"))) as server, client_for(server) as client:
        events = [event async for event in client.stream("m", "hello")]
        dispatcher = server.scheduler.dispatchers["m"]
        leftovers = [(h.estimator.in_flight, h.estimator.user_in_flight) for h in dispatcher.backends], dispatcher.busy
    kinds = [e.WhichOneof("event") for e in events]
    # told it went back, then where it got in: b0 never took it, so it was never announced
    assert kinds[:3] == ["queued", "queued", "dispatched"]
    assert [e.dispatched.backend for e in events if e.HasField("dispatched")] == ["b1"]
    assert events[1].queued.position_in_user_queue == 1 and kinds[-1] == "finished"
    assert len(b0.requests) == 1 and len(engine.finished) == 1
    assert failovers(server) == 1
    assert outcome_count(server, "completed") == 1 and outcome_count(server, "failed") == 0
    assert leftovers == ([(0, {}), (0, {})], 0)  # nothing held anywhere once it is done


async def test_a_client_that_leaves_while_its_request_waits_to_go_again_cancels_it() -> None:
    b0, engine = failing(BackendUnavailable("connection refused")), ControlledEngine(waiting=50)  # b1 is full
    async with serving(two_backends(), factory(b0, engine.backend("b1"))) as server, client_for(server) as client:
        call = client.stream("m", "hello")
        kinds = [(await next_event(call)).WhichOneof("event") for _ in range(2)]
        call.cancel()
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 1)
        busy = server.scheduler.dispatchers["m"].busy
    assert kinds == ["queued", "queued"]  # back in the queue, where it stays: b1 has no room
    assert busy == 0 and engine.started == [] and outcome_count(server, "failed") == 0


async def test_while_a_failed_backend_cools_down_new_requests_go_elsewhere() -> None:
    b0, engine = failing(BackendUnavailable("HTTP 503")), ControlledEngine(auto_release=True)
    config = two_backends(failover_cooldown_seconds=30.0)
    async with serving(config, factory(b0, engine.backend("b1"))) as server, client_for(server) as client:
        backends = [(await client.submit("m", f"q{i}")).backend for i in range(4)]
        states = server.scheduler.snapshot("m", "", 0).gates
    assert backends == ["b1"] * 4
    assert len(b0.requests) == 1  # only the first request found out that b0 was down
    cooling = [state.decision for state in states if state.name == "b0"]
    assert cooling and all(not d.open and d.reason.startswith("cooling down") for d in cooling)  # introspection


async def test_failover_stops_after_its_attempts_with_the_engines_error() -> None:
    b0 = failing(BackendUnavailable("connection refused"))
    b1 = failing(BackendUnavailable("connection refused"), name="b1")
    config = two_backends(failover_attempts=2, failover_cooldown_seconds=0.0)
    async with serving(config, factory(b0, b1)) as server, client_for(server) as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.submit("m", "hello")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(b0.requests) + len(b1.requests) == 3  # the first try and two failovers
    assert outcome_count(server, "failed") == 1


@pytest.mark.parametrize(
    ("error", "after_tokens", "code"),
    [
        (BackendUnavailable("connection dropped"), 2, grpc.StatusCode.UNAVAILABLE),  # tokens already sent
        (BackendRejectedRequest("prompt too long"), 0, grpc.StatusCode.INVALID_ARGUMENT),  # the request's fault
    ],
)
async def test_no_failover_after_the_first_token_or_for_a_rejected_request(
    error: BackendError, after_tokens: int, code: grpc.StatusCode
) -> None:
    b0, engine = failing(error, after_tokens), ControlledEngine(auto_release=True)
    async with serving(two_backends(), factory(b0, engine.backend("b1"))) as server, client_for(server) as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in client.stream("m", "hello"):
                pass
    assert err.value.code() == code
    assert len(b0.requests) == 1 and engine.started == []
    assert failovers(server) == 0


async def test_failover_can_be_switched_off() -> None:
    b0, engine = failing(BackendUnavailable("connection refused")), ControlledEngine(auto_release=True)
    config = two_backends(failover_attempts=0)
    async with serving(config, factory(b0, engine.backend("b1"))) as server, client_for(server) as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.submit("m", "hello")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert engine.started == []


@pytest.mark.parametrize("attempts", [0, 1])
async def test_an_engine_that_fails_a_request_with_no_attempts_left_cools_down_all_the_same(attempts: int) -> None:
    b0, engine = failing(BackendUnavailable("connection refused")), ControlledEngine(auto_release=True)
    b1 = failing(BackendUnavailable("connection refused"), name="b1") if attempts else engine.backend("b1")
    config = two_backends(failover_attempts=attempts, failover_cooldown_seconds=30.0)
    async with serving(config, factory(b0, b1)) as server, client_for(server) as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:  # b0, then (one attempt) b1: the engines' error
            await client.submit("m", "first")
        gates = server.scheduler.snapshot("m", "", 0).gates
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert (len(b0.requests), len(getattr(b1, "requests", []))) == (1, attempts)
    # every engine that failed it cools down, so the requests behind it do not meet it at once
    cooling = {state.name for state in gates if state.decision.reason.startswith("cooling down")}
    assert cooling == ({"b0", "b1"} if attempts else {"b0"})


async def test_an_engine_that_rejects_a_request_as_invalid_does_not_cool_down() -> None:
    b0, engine = failing(BackendRejectedRequest("prompt too long")), ControlledEngine(auto_release=True)
    config = two_backends(failover_cooldown_seconds=30.0)
    async with serving(config, factory(b0, engine.backend("b1"))) as server, client_for(server) as client:
        with pytest.raises(grpc.aio.AioRpcError):
            await client.submit("m", "first")
        gates = server.scheduler.snapshot("m", "", 0).gates
    b0_open = [state.decision.open for state in gates if state.name == "b0"]  # a gate per class
    assert b0_open and all(b0_open)


def test_a_request_put_back_goes_ahead_of_its_users_queue_and_positions_stay_right() -> None:
    queues = ModelQueues([PriorityClassConfig()])
    requests = [
        QueuedRequest(f"r{i}", "m", "alice", "interactive", "p", None, SamplingParams(max_tokens=4), float(i))
        for i in range(3)
    ]
    for request in requests:
        queues.push(request)
    flow = queues.flow_of("r0")
    assert flow is not None
    queues.remove("r0")  # dispatched
    queues.push(requests[0], front=True)  # failed before its first token: back at the head
    assert flow.head() is requests[0]
    assert [flow.position(r) for r in requests] == [1, 2, 3]
    queues.remove("r0")
    queues.remove("r1")
    queues.push(requests[1], front=True)  # and once more, after another left
    assert [r.request_id for r in flow] == ["r1", "r2"] and flow.position(requests[2]) == 2
    queues.remove("r1")
    queues.remove("r2")
    queues.push(requests[1], front=True)  # into an emptied queue, then a new request behind it
    queues.push(requests[2])
    flow = queues.flow_of("r1")
    assert flow is not None and [flow.position(r) for r in requests[1:]] == [1, 2]


def test_no_failover_past_the_deadline_or_once_shutdown_closed_the_queue() -> None:
    """On the fake clock: the same failure is failed over while the request still has time and the service
    runs, and not otherwise (it would only expire, or be cut, in the queue)."""
    classes = [{"name": "interactive", "rank": 0, "queue_ttl_seconds": 5.0}]
    # no cooldown: the failed engine stays open, so the dispatch pass below meets (and expires) what waits
    h = Harness({"classes": classes, "default_class": "interactive"}, {"failover_cooldown_seconds": 0.0}, cap=4)
    error = BackendUnavailable("connection refused")
    in_time, late = h.submit("a"), h.submit("b")
    h.dispatch()
    assert h.events.fail_over(in_time, error) and in_time.state is TicketState.QUEUED
    h.clock.advance(6.0)  # past the 5 s TTL of both
    assert not h.events.fail_over(late, error) and late.state is TicketState.DISPATCHED
    at_shutdown = h.submit("c")  # a fresh deadline
    h.dispatch()
    assert in_time.outcome is Outcome.EXPIRED  # never sent again once its time was up
    h.dispatcher.shutdown.reject_all_queued("stopping")
    assert not h.events.fail_over(at_shutdown, error) and at_shutdown.state is TicketState.DISPATCHED

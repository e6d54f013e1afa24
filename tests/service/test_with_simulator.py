"""The whole service against the engine simulator over real HTTP: S1, gating, cancellation, faults."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any

import grpc
import pytest
from aiohttp import web

from backends.sim import SimConfig, running_simulator
from backends.sim.vllm_api import VllmApi
from clients import pb
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.core.ticket import Ticket
from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.dispatch.dispatcher import ModelDispatcher
from tests.helpers import client_for, client_label, eventually, make_config, outcome_count, serving, until_settled
from tests.stream_events import event_or_end

FAST = SimConfig(decode_base_ms=2.0, decode_per_seq_ms=0.5)


async def _first_delta(call: grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]) -> None:
    while True:
        event = await event_or_end(call)
        assert event is not None, "stream ended before a token"
        if event.HasField("delta"):
            return


async def test_s1_latecomers_are_served_long_before_the_flood_drains(monkeypatch: pytest.MonkeyPatch) -> None:
    target = 3
    events: list[str] = []  # "A"/"B" when dispatched, "admit B" when B enters the queue
    assign, enqueue = Ticket.assign, ModelDispatcher.enqueue

    def recording_assign(ticket: Ticket, backend: BackendHandle, now: float, priority: int | None = None) -> None:
        events.append(ticket.request.user)
        assign(ticket, backend, now, priority)

    def recording_enqueue(dispatcher: ModelDispatcher, request: QueuedRequest, **kwargs: Any) -> Ticket:
        if request.user == "B":
            events.append("admit B")
        return enqueue(dispatcher, request, **kwargs)

    monkeypatch.setattr(Ticket, "assign", recording_assign)
    monkeypatch.setattr(ModelDispatcher, "enqueue", recording_enqueue)
    async with running_simulator(replace(FAST, max_num_seqs=4)) as sim:
        # round robin, whose bound on the latecomer's wait this checks; the engine's slots unknown, as a bound
        # on its queue holds only then (known slots let a request bound for a slot freed mid-step wait a step)
        config = make_config(
            backend_url=sim.url,
            gate={"waiting_target": target},
            scheduling={"fairness": "round_robin"},
            backend={"learn_max_num_seqs": False},
        )
        async with serving(config) as server, client_for(server, user="A") as a, client_for(server, user="B") as b:
            flood = [
                asyncio.create_task(a.submit("m", f"flood {i}", max_tokens=40, ignore_eos=True)) for i in range(40)
            ]
            _, _ = await asyncio.wait(flood, return_when=asyncio.FIRST_COMPLETED)  # the engine is busy
            admitted_before = len(sim.engine.stats()["served_order"])
            late = b.stream("m", "just one question", max_tokens=8, ignore_eos=True, request_id="latecomer")
            await _first_delta(late)
            flood_left = sum(not t.done() for t in flood)
            order = [client_label(entry["request_id"]) for entry in sim.engine.stats()["served_order"]]
            late.cancel()
            results = await asyncio.gather(*flood)
            stats = sim.engine.stats()
    assert flood_left >= 20, f"the latecomer waited for most of the flood ({40 - flood_left} of 40 done)"
    # The scheduler sends it after at most one more of the flood's requests (round robin).
    after_admission = events[events.index("admit B") + 1 :]
    assert after_admission.index("B") <= 1, after_admission[:5]
    # In the engine, ahead of it: at most the `target` already waiting there, the one more from the ring,
    # and one more whose HTTP request, dispatched just after it, overtook it on the way to the engine.
    assert order.index("latecomer") - admitted_before <= target + 2
    assert stats["max_waiting_seen"] <= target, "the gate let the engine queue grow past its target"
    assert all(r.usage.completion_tokens == 40 for r in results)


async def test_client_cancel_aborts_the_request_inside_the_engine() -> None:
    async with (
        running_simulator(SimConfig(decode_base_ms=10.0)) as sim,
        serving(make_config(backend_url=sim.url)) as server,
        client_for(server) as client,
    ):
        call = client.stream("m", "a long story", max_tokens=2000, ignore_eos=True)
        await _first_delta(call)
        assert sim.engine.stats()["running"] == 1
        call.cancel()
        await eventually(lambda: sim.engine.stats()["aborted_total"] == 1, what="engine abort")
        await until_settled(server, lambda: outcome_count(server, "cancelled") == 1)
        assert sim.engine.stats()["running"] == 0


def _accept_series(server: SchedulerServer) -> tuple[float, float]:
    """(count, sum) of llmsched_engine_accept_seconds for model m, backend b0."""
    registry = server.scheduler.metrics.registry
    labels = {"model": "m", "backend": "b0"}
    count = registry.get_sample_value("llmsched_engine_accept_seconds_count", labels)
    total = registry.get_sample_value("llmsched_engine_accept_seconds_sum", labels)
    return count or 0.0, total or 0.0


async def test_the_engines_intake_is_timed_from_sending_to_its_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """llmsched_engine_accept_seconds and the call's own `engine_accept` timing: an engine whose front end
    answers 0.3 s after the request reached it shows it there; one that answers at once does not."""
    completions, delay = VllmApi.completions, [0.0]

    async def slow_front_end(api: VllmApi, request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(delay[0])  # the engine's side: before its response headers
        return await completions(api, request)

    monkeypatch.setattr(VllmApi, "completions", slow_front_end)
    async with (
        running_simulator(FAST) as sim,
        serving(make_config(backend_url=sim.url)) as server,
        client_for(server) as client,
    ):
        at_once = await client.submit("m", "at once", max_tokens=2)
        prompt = _accept_series(server)
        delay[0] = 0.3
        answered_late = await client.submit("m", "late", max_tokens=2)
        late = _accept_series(server)
    assert prompt[0] == 1 and prompt[1] < 0.3
    assert late[0] == 2 and late[1] - prompt[1] >= 0.3
    assert at_once.timings.HasField("engine_accept") and answered_late.timings.HasField("engine_accept")
    assert at_once.timings.engine_accept.ToTimedelta().total_seconds() < 0.3
    accepted_late = answered_late.timings.engine_accept.ToTimedelta().total_seconds()
    assert 0.3 <= accepted_late <= answered_late.timings.time_to_first_token.ToTimedelta().total_seconds()


async def test_engine_killed_mid_stream_gives_unavailable_and_service_resumes_when_it_is_back() -> None:
    first_engine = running_simulator(SimConfig(decode_base_ms=10.0))
    sim = await first_engine.__aenter__()
    try:
        async with serving(make_config(backend_url=sim.url)) as server, client_for(server) as client:
            call = client.stream("m", "doomed", max_tokens=2000, ignore_eos=True)
            await _first_delta(call)
            await first_engine.__aexit__(None, None, None)  # the engine dies with the stream open
            with pytest.raises(grpc.aio.AioRpcError) as err:
                while await event_or_end(call) is not None:
                    pass
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            async with running_simulator(FAST, port=sim.port):
                response = await client.submit("m", "back again", max_tokens=5, ignore_eos=True)
            assert response.usage.completion_tokens == 5
            assert outcome_count(server, "failed") == 1
    finally:
        with contextlib.suppress(Exception):
            await first_engine.__aexit__(None, None, None)


async def test_a_dead_engine_fails_requests_over_to_a_live_one_over_real_http() -> None:
    """b0's port refuses connections (the adapter's BackendUnavailable), b1 is a live simulator: every
    request completes on b1, and only the first one ever tried b0 while it cooled down."""
    async with running_simulator(FAST) as sim:
        config = make_config(
            models=[
                {
                    "name": "m",
                    "default_max_tokens": 8,
                    "failover_cooldown_seconds": 30.0,
                    "backends": [
                        {"name": "b0", "kind": "vllm", "url": "http://127.0.0.1:1", "engine_model": "sim-model"},
                        {"name": "b1", "kind": "vllm", "url": sim.url, "engine_model": "sim-model"},
                    ],
                }
            ]
        )
        async with serving(config) as server, client_for(server) as client:
            responses = [await client.submit("m", f"q{i}", max_tokens=4, ignore_eos=True) for i in range(3)]
            failed_over = server.scheduler.metrics.registry.get_sample_value(
                "llmsched_requests_failed_over_total", {"model": "m", "backend": "b0"}
            )
    assert [r.backend for r in responses] == ["b1"] * 3
    assert all(r.usage.completion_tokens == 4 for r in responses)
    assert failed_over == 1


async def test_dead_metrics_endpoint_degrades_to_a_concurrency_cap() -> None:
    async with running_simulator(replace(FAST, max_num_seqs=8)) as sim:
        sim.faults.update({"metrics_down": True})
        config = make_config(backend_url=sim.url, gate={"fallback_max_in_flight": 2})
        async with serving(config) as server, client_for(server) as client:
            results = await asyncio.gather(
                *(client.submit("m", f"p{i}", max_tokens=20, ignore_eos=True) for i in range(8))
            )
            fresh = server.scheduler.metrics.registry.get_sample_value(
                "llmsched_backend_metrics_fresh", {"model": "m", "backend": "b0"}
            )
        stats = sim.engine.stats()
    assert all(r.usage.completion_tokens == 20 for r in results)  # not wedged
    assert stats["max_running_seen"] <= 2  # not flooded
    assert fresh == 0

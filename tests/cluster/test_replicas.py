"""Three replicas in one event loop, on one in-memory store, in front of one simulator: one leader decides,
each owner runs its own calls, and the engine sees one budget."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import grpc
import pytest

from backends.sim import SimConfig, running_simulator
from clients import error_reason, pb, retry_delay
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.cluster.store import DuplicateReplica
from scheduler_svc.core.ticket import TicketState
from tests.cluster.fake_store import FakeStore
from tests.cluster.replicas import agent_of, cluster_config, replicas, serving
from tests.helpers import client_for, client_label, eventually, queue_depth
from tests.stream_events import next_event

FAST = SimConfig(decode_base_ms=2.0, decode_per_seq_ms=0.5)


def engine_ids(sim_stats: dict[str, object]) -> list[str]:
    order = sim_stats["served_order"]
    assert isinstance(order, list)
    return [str(entry["request_id"]) for entry in order]


async def first_delta(call: grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]) -> None:
    while not (await next_event(call)).HasField("delta"):
        pass


def mirrors(server: SchedulerServer) -> int:
    return len(agent_of(server).leader.mirrors)


async def test_a_request_at_a_follower_is_dispatched_by_the_leader_and_run_by_its_owner() -> None:
    async with running_simulator(FAST) as sim, replicas(sim.url) as (_, servers):
        leader, follower = servers[0], servers[1]
        grants_before = agent_of(leader).metrics.sent.labels("grant")._value.get()
        async with client_for(follower, user="alice") as client:
            response = await client.submit("m", "hello there", max_tokens=5, ignore_eos=True, request_id="one")
        assert response.usage.completion_tokens == 5
        ids = engine_ids(sim.engine.stats())
        assert [client_label(i) for i in ids] == ["one"], "the engine saw it exactly once"
        assert agent_of(leader).metrics.sent.labels("grant")._value.get() == grants_before + 1
        # The leader's engine budget and fairness saw it: its estimator dispatched and released it.
        await eventually(lambda: mirrors(leader) == 0, 2.0, "the leader's mirror released")
        assert leader.scheduler.dispatchers["m"].backends[0].estimator.in_flight == 0
        assert follower.scheduler.dispatchers["m"].backends[0].estimator.in_flight == 0


def counted(servers: list[SchedulerServer], name: str) -> float:
    """`name`'s samples summed over every replica's registry and label set (what a dashboard's sum shows)."""
    return sum(
        sample.value
        for server in servers
        for metric in server.scheduler.metrics.registry.collect()
        for sample in metric.samples
        if sample.name == name
    )


async def test_a_request_at_a_follower_is_counted_once_over_all_replicas() -> None:
    """The leader's mirror decides for the request, its owner serves it: the per-request series are the
    owner's, so summing them over the replicas counts each call once (not once per replica that held it)."""
    async with running_simulator(FAST) as sim, replicas(sim.url) as (_, servers):
        leader, follower = servers[0], servers[1]
        async with client_for(follower, user="alice") as client:
            await client.submit("m", "hello there", max_tokens=5, ignore_eos=True, request_id="one")
        await eventually(lambda: mirrors(leader) == 0, 2.0, "the leader's mirror released")
        assert counted(servers, "llmsched_requests_admitted_total") == 1
        assert counted(servers, "llmsched_requests_dispatched_total") == 1
        assert counted(servers, "llmsched_request_outcomes_total") == 1
        assert counted(servers, "llmsched_time_to_first_token_seconds_count") == 1
        assert counted(servers, "llmsched_queue_wait_seconds_count") == 1
        assert counted(servers, "llmsched_engine_accept_seconds_count") == 1
        assert counted(servers, "llmsched_generated_tokens_total") == 5
        assert counted([follower], "llmsched_request_outcomes_total") == 1, "the owner counts it"


async def test_one_engine_budget_for_a_flood_spread_over_three_replicas() -> None:
    """The engine's waiting queue, as the simulator counts it, stays within the gate target + 1 with a
    flood arriving round robin at three replicas (three independent schedulers would reach 3x target)."""
    target = 2
    async with (
        running_simulator(dataclasses.replace(FAST, max_num_seqs=4)) as sim,
        replicas(sim.url, gate={"waiting_target": target}) as (_, servers),
    ):
        clients = [client_for(s, user=f"u{i}") for i, s in enumerate(servers)]
        async with contextlib.AsyncExitStack() as stack:
            for c in clients:
                await stack.enter_async_context(c)
            calls = [
                clients[i % 3].submit("m", f"flood {i}", max_tokens=20, ignore_eos=True, request_id=f"f{i}")
                for i in range(36)
            ]
            results = await asyncio.gather(*calls)
        stats = sim.engine.stats()
    assert all(r.usage.completion_tokens == 20 for r in results)
    ids = engine_ids(stats)
    assert len(ids) == len(set(ids)) == 36, "every request reached the engine exactly once"
    assert stats["max_waiting_seen"] <= target + 1, f"engine waiting reached {stats['max_waiting_seen']}"


async def test_global_fairness_a_latecomer_at_a_follower_is_served_soon() -> None:
    """User A floods through all three replicas; B's one request at a follower goes within a few
    dispatches (round robin at the leader), long before the flood drains."""
    target = 2
    async with (
        running_simulator(dataclasses.replace(FAST, max_num_seqs=4)) as sim,
        replicas(sim.url, gate={"waiting_target": target}) as (_, servers),
        contextlib.AsyncExitStack() as stack,
    ):
        floods = [await stack.enter_async_context(client_for(s, user="A")) for s in servers]
        b = await stack.enter_async_context(client_for(servers[2], user="B"))
        flood = [
            asyncio.create_task(floods[i % 3].submit("m", f"flood {i}", max_tokens=40, ignore_eos=True))
            for i in range(45)
        ]
        await asyncio.wait(flood, return_when=asyncio.FIRST_COMPLETED)
        admitted_before = len(engine_ids(sim.engine.stats()))
        late = b.stream("m", "just one", max_tokens=8, ignore_eos=True, request_id="latecomer")
        await first_delta(late)
        flood_left = sum(not t.done() for t in flood)
        order = [client_label(i) for i in engine_ids(sim.engine.stats())]
        late.cancel()
        await asyncio.gather(*flood)
    assert flood_left >= 20, f"the latecomer waited for most of the flood ({45 - flood_left} of 45 done)"
    # As on one replica: ahead of it in the engine at most the target waiting, one more from the ring, and
    # one that overtook it on the way.
    assert order.index("latecomer") - admitted_before <= target + 2


async def test_duplicate_id_and_per_user_cap_are_global() -> None:
    async with (
        running_simulator(SimConfig(max_num_seqs=1, decode_base_ms=20.0)) as sim,
        replicas(sim.url, gate={"waiting_target": 1}, model={"max_queued_per_user": 3}) as (_, servers),
        contextlib.AsyncExitStack() as stack,
    ):
        c0, c1, c2 = [await stack.enter_async_context(client_for(s, user="alice")) for s in servers]
        held = c0.stream("m", "long", max_tokens=400, ignore_eos=True, request_id="same")
        await first_delta(held)
        with pytest.raises(grpc.aio.AioRpcError) as dup:
            await c1.submit("m", "again", max_tokens=5, request_id="same")
        assert dup.value.code() == grpc.StatusCode.ALREADY_EXISTS
        # Fill alice's cap (3 queued) through two replicas; one more at the third is refused with a hint.
        queued = [c1.stream("m", f"q{i}", max_tokens=400, ignore_eos=True, request_id=f"q{i}") for i in range(4)]
        await eventually(lambda: queue_depth(servers[0]) == 3, 5.0, "the leader queues 3 of alice's requests")
        with pytest.raises(grpc.aio.AioRpcError) as full:
            await c2.submit("m", "one too many", max_tokens=5, request_id="over")
        assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_reason(full.value) == "QUEUE_FULL"
        assert (retry_delay(full.value) or 0) > 0, "the leader's retry hint reaches the client"
        for call in [held, *queued]:
            call.cancel()


async def test_cancel_at_a_follower_releases_the_leaders_queue_and_budget() -> None:
    async with (
        running_simulator(SimConfig(max_num_seqs=1, decode_base_ms=20.0)) as sim,
        replicas(sim.url, gate={"waiting_target": 1}) as (_, servers),
    ):
        leader, follower = servers[0], servers[1]
        lead = leader.scheduler.dispatchers["m"]
        async with client_for(follower, user="bob") as client:
            running = client.stream("m", "long", max_tokens=2000, ignore_eos=True, request_id="run")
            await first_delta(running)
            more = [client.stream("m", f"w{i}", max_tokens=2000, ignore_eos=True, request_id=f"w{i}") for i in range(4)]
            await eventually(lambda: mirrors(leader) == 5 and queue_depth(leader) >= 1, 5.0, "one queued at the leader")
            queued_before = queue_depth(leader)
            queued_mirror = next(
                m for m in agent_of(leader).leader.mirrors.values() if m.ticket.state is TicketState.QUEUED
            )
            queued_call = more[[f"w{i}" for i in range(4)].index(queued_mirror.ticket.request.client_request_id)]
            queued_call.cancel()
            await eventually(lambda: queue_depth(leader) == queued_before - 1, 3.0, "the queued mirror left the queue")
            aborted = sim.engine.stats()["aborted_total"]
            running.cancel()
            await eventually(lambda: sim.engine.stats()["aborted_total"] > aborted, 3.0, "the engine request aborted")
            await eventually(
                lambda: (
                    "run" not in {m.ticket.request.client_request_id for m in agent_of(leader).leader.mirrors.values()}
                ),
                3.0,
                "the leader released it",
            )
            for call in more:
                call.cancel()
        await eventually(
            lambda: lead.backends[0].estimator.in_flight == 0 and mirrors(leader) == 0, 3.0, "budget released"
        )


async def test_a_second_replica_with_a_live_name_is_refused_at_start() -> None:
    async with running_simulator(FAST) as sim, replicas(sim.url, count=2) as (store, _):
        twin = SchedulerServer(cluster_config(sim.url, "r1"), store_factory=serving(FakeStore(store)))
        with pytest.raises(DuplicateReplica):
            await twin.start()
        await twin.scheduler.aclose()


async def test_a_failover_at_a_follower_is_decided_by_the_leader() -> None:
    """b0 refuses connections: the owner's attempt there fails before any token, the owner requeues it and
    reports; the leader's failover rule cools b0 down and grants b1, where it completes."""
    async with running_simulator(FAST) as sim:
        backends = [
            {"name": "b0", "kind": "vllm", "url": "http://127.0.0.1:1", "engine_model": "sim-model"},
            {"name": "b1", "kind": "vllm", "url": sim.url, "engine_model": "sim-model"},
        ]
        model = {"failover_cooldown_seconds": 30.0}
        async with replicas(sim.url, backends=backends, model=model) as (_, servers), client_for(servers[1]) as client:
            responses = [await client.submit("m", f"q{i}", max_tokens=4, ignore_eos=True) for i in range(3)]
            leader = servers[0].scheduler.dispatchers["m"]
            assert leader.backends[0].cooling_for(leader.clock.now()) > 0, "the leader cooled b0 down"
            await eventually(lambda: mirrors(servers[0]) == 0, 2.0, "the leader's mirrors released")
            failovers = counted(servers, "llmsched_requests_failed_over_total")
    assert [r.backend for r in responses] == ["b1"] * 3
    assert all(r.usage.completion_tokens == 4 for r in responses)
    assert len(engine_ids(sim.engine.stats())) == 3
    assert failovers == 1, "the one failover (b0 is then cooled down) counted once over the replicas"


async def test_a_streaming_client_at_a_follower_hears_its_position_in_the_leaders_queue() -> None:
    """alice has two requests queued at the leader (beside one running, one waiting in the engine); her
    stream at a follower is third in her queue there, though first in the follower's own queue."""
    async with (
        running_simulator(SimConfig(max_num_seqs=1, decode_base_ms=20.0)) as sim,
        replicas(sim.url, gate={"waiting_target": 1}) as (_, servers),
        client_for(servers[0], user="alice") as at_leader,
        client_for(servers[1], user="alice") as at_follower,
    ):
        held = [at_leader.stream("m", f"h{i}", max_tokens=2000, ignore_eos=True) for i in range(4)]
        await eventually(lambda: queue_depth(servers[0]) == 2, 5.0, "two of alice's queued at the leader")
        call = at_follower.stream("m", "mine", max_tokens=5, ignore_eos=True)
        positions: list[int] = []
        while not positions or positions[-1] != 3:
            event = await asyncio.wait_for(next_event(call), 5.0)
            assert event.HasField("queued"), event
            positions.append(event.queued.position_in_user_queue)
        assert positions[-1] == 3, positions
        for c in [call, *held]:
            c.cancel()


async def test_a_grant_ignored_while_following_the_leaders_previous_term_is_sent_again() -> None:
    """The leader's replica began a new term (it lost the lead and took it back) before an owner noticed: the
    owner's Admit still reached it (inboxes are per replica name) but the owner ignored the grant (another
    holder). When the owner registers with the new term, the leader grants again; nothing waits forever."""
    async with (
        running_simulator(FAST) as sim,
        replicas(sim.url, count=2, cluster={"heartbeat_timeout_seconds": 5.0}) as (_, servers),
    ):
        leader, owner = servers
        agent = agent_of(owner)
        agent._tasks[0].cancel()  # its heartbeat: it looks at the lease when the test says so
        agent.follower.leaders["m"] = "r0/previous-term"
        async with client_for(owner, user="bob") as client:
            call = asyncio.create_task(client.submit("m", "hi", max_tokens=3, ignore_eos=True, request_id="x"))
            await eventually(lambda: agent.metrics.stale_grants._value.get() >= 1, 5.0, "the grant ignored")
            agent.follower.follow("m", agent_of(leader).holder_of("m"))  # its next heartbeat's: register again
            response = await asyncio.wait_for(call, 5.0)
        assert response.usage.completion_tokens == 3
        assert [client_label(i) for i in engine_ids(sim.engine.stats())] == ["x"], "the engine saw it once"
        await eventually(lambda: mirrors(leader) == 0, 2.0, "the leader's mirror released")
        assert leader.scheduler.dispatchers["m"].backends[0].estimator.in_flight == 0

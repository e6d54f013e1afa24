"""Leadership split by model, three replicas in one event loop on one in-memory store in front of one
simulator: each model's lease is held by one replica and different models by different replicas, every
replica sends each model's requests to that model's leader; a replica holding more than its share hands a
lease over; killing one model's leader moves that model's lead and leaves the other model's leader as it
was, with nothing lost or sent twice."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from backends.sim import SimConfig, running_simulator
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.cluster.agent import LeaseState
from scheduler_svc.cluster.leases import EVERY_MODEL
from scheduler_svc.cluster.modes import Role
from scheduler_svc.core.ticket import Ticket
from tests.cluster.fake_store import FakeStore, FakeStoreBackend
from tests.cluster.replicas import (
    HEARTBEAT,
    TIMEOUT,
    agent_of,
    cluster_config,
    leaders_settled,
    start_replica,
    stop_all,
)
from tests.cluster.test_replicas import engine_ids, first_delta
from tests.helpers import client_for, client_label, eventually
from tests.stream_events import event_or_end

FAST = SimConfig(decode_base_ms=2.0, decode_per_seq_ms=0.5)
MODELS = ("a", "b")


@contextlib.asynccontextmanager
async def model_replicas(
    backend_url: str, count: int = 3, models: tuple[str, ...] = MODELS, **kwargs: Any
) -> AsyncIterator[tuple[FakeStoreBackend, list[SchedulerServer]]]:
    """`count` replicas r0.. serving `models`, started one after the other: r0 takes every lease alone, and
    hands one to each replica that joins while it holds more than its share."""
    store = FakeStoreBackend()
    servers: list[SchedulerServer] = []
    try:
        for i in range(count):
            servers.append(await start_replica(store, cluster_config(backend_url, f"r{i}", models=models, **kwargs)))
            await leaders_settled(servers, models)
        yield store, servers
    finally:
        await stop_all(servers)


def holds_no_mirrors(server: SchedulerServer) -> bool:
    return not agent_of(server).leader.mirrors


def no_request_twice(sim_stats: dict[str, object]) -> list[str]:
    labels = [client_label(i) for i in engine_ids(sim_stats)]
    twice = {label: n for label, n in Counter(labels).items() if n > 1}
    assert not twice, f"dispatched to the engine more than once: {twice}"
    return labels


async def test_each_model_is_led_by_its_own_replica_and_its_requests_go_to_that_leader() -> None:
    async with (
        running_simulator(SimConfig(decode_base_ms=10.0)) as sim,
        model_replicas(sim.url) as (store, servers),
    ):
        leaders = await leaders_settled(servers, MODELS)
        assert leaders["a"] is not leaders["b"], "both models led by one replica"
        assert {lease: holder for lease, (holder, _) in store.leases.items()} == {
            m: agent_of(leaders[m]).holder_of(m) for m in MODELS
        }
        (owner,) = [s for s in servers if s not in leaders.values()]
        assert agent_of(owner).leading == [] and agent_of(owner).role is Role.FOLLOWING
        async with client_for(owner, user="alice") as client:
            calls = {m: client.stream(m, f"to {m}", max_tokens=60, ignore_eos=True, request_id=m) for m in MODELS}
            for call in calls.values():
                await first_delta(call)
            for model, leader in leaders.items():
                held = {
                    m.ticket.request.request_id: m.ticket.request.model
                    for m in agent_of(leader).leader.mirrors.values()
                }
                assert sorted(held.values()) == [model], f"{model}'s leader holds {held}"
            for call in calls.values():
                while await event_or_end(call) is not None:
                    pass
        for leader in leaders.values():
            await eventually(functools.partial(holds_no_mirrors, leader), 10.0, "mirrors released")
        assert sorted(no_request_twice(sim.engine.stats())) == ["a", "b"]
        for model, leader in leaders.items():
            granted = agent_of(leader).metrics.sent.labels("grant")._value.get()
            assert granted == 1, f"{model}'s leader sent {granted} grants"


async def test_a_replica_above_its_share_hands_a_lease_over_and_its_running_request_is_adopted() -> None:
    """r0 alone leads both models and runs a request of each; once r1 joins, r0 holds more than its share
    (one lease each) and hands "b" over: r1 leads it and adopts r0's running "b" request without a grant,
    which ends once at the engine."""
    async with running_simulator(SimConfig(decode_base_ms=10.0)) as sim:
        store = FakeStoreBackend()
        r0 = await start_replica(store, cluster_config(sim.url, "r0", models=MODELS))
        servers = [r0]
        try:
            await leaders_settled(servers, MODELS)
            assert agent_of(r0).leading == ["a", "b"]
            async with client_for(r0, user="alice") as client:
                calls = [client.stream(m, f"long {m}", max_tokens=120, ignore_eos=True, request_id=m) for m in MODELS]
                for call in calls:
                    await first_delta(call)
                r1 = await start_replica(store, cluster_config(sim.url, "r1", models=MODELS))
                servers.append(r1)
                leaders = await leaders_settled(servers, MODELS)
                assert leaders == {"a": r0, "b": r1}
                estimator = r1.scheduler.dispatchers["b"].backends[0].estimator
                await eventually(lambda: estimator.in_flight == 1, 10.0, "r1 counts r0's running b request")
                for call in calls:
                    while await event_or_end(call) is not None:
                        pass
                await eventually(lambda: estimator.in_flight == 0, 10.0, "released at its end")
            assert agent_of(r1).metrics.sent.labels("grant")._value.get() == 0, "adopted without a grant"
            assert sorted(no_request_twice(sim.engine.stats())) == ["a", "b"]
        finally:
            await stop_all(servers)


async def test_killing_one_models_leader_moves_that_model_only_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with (
        running_simulator(dataclasses.replace(FAST, max_num_seqs=4)) as sim,
        model_replicas(sim.url, gate={"waiting_target": 2}) as (_, servers),
    ):
        leaders = await leaders_settled(servers, MODELS)
        doomed, keeper = leaders["a"], leaders["b"]
        b_holder = agent_of(keeper).holder_of("b")
        changes: list[tuple[tuple[str, ...], Role]] = []
        apply = agent_of(keeper)._apply

        def recording_apply(lease: LeaseState, role: Role, holder: str | None = None) -> None:
            if role is not lease.role:
                changes.append((lease.models, role))
            apply(lease, role, holder)

        monkeypatch.setattr(agent_of(keeper), "_apply", recording_apply)
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(client_for(s, user=f"u{i}")) for i, s in enumerate(servers)]
            owner = {f"f{i}": servers[i % 3] for i in range(60)}
            flood = {
                rid: asyncio.create_task(
                    clients[i % 3].submit(MODELS[i % 2], f"{rid}", max_tokens=30, ignore_eos=True, request_id=rid)
                )
                for i, rid in enumerate(owner)
            }
            await eventually(lambda: sum(t.done() for t in flood.values()) >= 6, 10.0, "the flood under way")
            b_dispatcher = keeper.scheduler.dispatchers["b"]
            b_before = b_dispatcher.dispatches
            await agent_of(doomed).kill()  # from here the others hear nothing from it
            killed_at = time.monotonic()
            stopping = asyncio.create_task(doomed.stop(grace=0.0))  # its own calls end
            survivors = [s for s in servers if s is not doomed]
            await eventually(
                lambda: any(agent_of(s).role_of("a") is Role.LEADING for s in survivors), 5.0, "a new leader of a"
            )
            took = time.monotonic() - killed_at
            b_during = b_dispatcher.dispatches - b_before
            await stopping
            after = await leaders_settled(survivors, MODELS)
            b_holder_after = agent_of(keeper).holder_of("b")
            b_changes = [role for models, role in changes if models == ("b",)]  # before the shutdown hands it over
            outcomes = dict(zip(flood, await asyncio.gather(*flood.values(), return_exceptions=True), strict=True))
        labels = no_request_twice(sim.engine.stats())
    assert took <= 2 * TIMEOUT, f"model a's lead moved after {took:.2f}s"
    assert after["b"] is keeper and b_holder_after == b_holder, "model b's leader changed"
    assert not b_changes, f"model b's lease changed role at its leader: {b_changes}"
    assert b_during > 0, "model b's leader dispatched nothing while model a had no leader"
    for rid, outcome in outcomes.items():
        if owner[rid] is doomed:
            assert not isinstance(outcome, BaseException) or (
                isinstance(outcome, grpc.aio.AioRpcError) and outcome.code() == grpc.StatusCode.UNAVAILABLE
            ), f"{rid}: {outcome!r}"
        else:
            assert not isinstance(outcome, BaseException), f"{rid} at a survivor failed: {outcome!r}"
            assert rid in labels, f"{rid} completed without reaching the engine"


async def test_with_global_fairness_counters_one_replica_leads_every_model() -> None:
    """A user's counter shared by every model needs one replica deciding for every model: one lease."""
    async with running_simulator(FAST) as sim:
        store = FakeStoreBackend()
        servers = []
        try:
            for name in ("r0", "r1"):
                config = cluster_config(sim.url, name, models=MODELS, scheduling={"fairness_scope": "global"})
                servers.append(await start_replica(store, config))
            leaders = await leaders_settled(servers, MODELS)
            assert leaders["a"] is leaders["b"]
            assert list(store.leases) == [EVERY_MODEL]
            async with client_for(servers[1] if leaders["a"] is servers[0] else servers[0]) as client:
                for model in MODELS:
                    response = await client.submit(model, "hi", max_tokens=3, ignore_eos=True)
                    assert response.usage.completion_tokens == 3
        finally:
            await stop_all(servers)


async def test_a_followers_token_counts_reach_its_models_leader_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader's fairness counters are charged every token a follower's request generated: counts queued
    before the mirror's first token and counts taken at once after it add up to the answer."""
    async with (
        running_simulator(SimConfig(decode_base_ms=5.0)) as sim,
        model_replicas(sim.url, count=2, models=("a",)) as (_, servers),
    ):
        leader, owner = servers
        charged: Counter[str] = Counter()
        dispatcher = leader.scheduler.dispatchers["a"]
        on_generated = dispatcher.events.on_generated

        def counting(ticket: Ticket, tokens: int) -> None:
            charged[ticket.request.request_id] += tokens
            on_generated(ticket, tokens)

        monkeypatch.setattr(dispatcher.events, "on_generated", counting)
        async with client_for(owner, user="bob") as client:
            response = await client.submit("a", "count me", max_tokens=80, ignore_eos=True)
        assert response.usage.completion_tokens == 80
        await eventually(lambda: not agent_of(leader).leader.mirrors, 10.0, "the mirror ended")
        assert list(charged.values()) == [80]


async def test_a_lease_nobody_takes_comes_back_and_is_not_handed_over_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A member that takes no lease (a replica draining after SIGTERM still counts as one) puts r0 above its
    share: r0 hands "b" over, nobody takes it, r0 takes it back by the free-lease rule, and while the members
    stay the same it hands nothing over again (no lease swinging back and forth, re-registering each time)."""
    async with running_simulator(FAST) as sim:
        store = FakeStoreBackend()
        r0 = await start_replica(store, cluster_config(sim.url, "r0", models=MODELS))
        try:
            await leaders_settled([r0], MODELS)
            agent = agent_of(r0)
            handed: list[tuple[str, ...]] = []
            hand_over = agent._hand_over

            async def recording_hand_over(lease: LeaseState, members: list[str]) -> None:
                handed.append(lease.models)
                await hand_over(lease, members)

            monkeypatch.setattr(agent, "_hand_over", recording_hand_over)
            idle = FakeStore(store)
            await idle.join("draining", "t", 3600.0)  # a member that never looks at the leases
            await eventually(lambda: handed == [("b",)], 5.0, "b handed over")
            await eventually(lambda: agent.leading == ["a", "b"], 5.0, "b taken back for want of a taker")
            beats = 10
            await asyncio.sleep(beats * HEARTBEAT)  # heartbeats with nothing to do: no event to wait on
            assert handed == [("b",)] and agent.leading == ["a", "b"]
            await idle.leave("draining", "t")
            await eventually(lambda: agent.members == 1, 5.0, "the member gone")
            async with client_for(r0) as client:
                for model in MODELS:
                    response = await client.submit(model, "hi", max_tokens=3, ignore_eos=True)
                    assert response.usage.completion_tokens == 3
        finally:
            await r0.stop(grace=0.5)

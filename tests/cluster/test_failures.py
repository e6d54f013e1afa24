"""Failures with three replicas on one in-memory store and one simulator: a replica killed (leader or
follower), a graceful handover, the store going away and coming back empty."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

import grpc
import pytest

from backends.sim import SimConfig, running_simulator
from clients import SchedulerClient
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.cluster.agent import ClusterAgent, LeaseState
from scheduler_svc.cluster.messages import Roster
from scheduler_svc.cluster.modes import Role
from scheduler_svc.cluster.store import StoreTimeout, StoreUnavailable
from tests.cluster.fake_store import FakeStore, FakeStoreBackend
from tests.cluster.replicas import TIMEOUT, agent_of, cluster_config, replicas, serving, settled, stop_all
from tests.cluster.test_replicas import engine_ids, first_delta
from tests.helpers import client_for, eventually, queue_depth
from tests.stream_events import event_or_end

FAST = SimConfig(decode_base_ms=2.0, decode_per_seq_ms=0.5)


async def kill(server: SchedulerServer) -> None:
    """As `kill -9` would leave it for the others: the agent stops at once (nothing released, nothing sent),
    and the process's own calls end (UNAVAILABLE: its server is gone)."""
    await agent_of(server).kill()
    await server.stop(grace=0.0)


async def _outcomes(tasks: list[asyncio.Task[object]]) -> list[object]:
    return list(await asyncio.gather(*tasks, return_exceptions=True))


async def _flood_under_way(
    clients: list[SchedulerClient], count: int, max_tokens: int, under_way: int
) -> list[asyncio.Task[object]]:
    """`count` calls ("f0", "f1", ...) spread over the replicas' clients in turn, returned once `under_way`
    of them have ended: the flood runs at the engine and fills the queues."""
    flood: list[asyncio.Task[object]] = [
        asyncio.create_task(
            clients[i % len(clients)].submit("m", f"f {i}", max_tokens=max_tokens, ignore_eos=True, request_id=f"f{i}")
        )
        for i in range(count)
    ]
    await eventually(lambda: sum(t.done() for t in flood) >= under_way, 10.0, "the flood under way")
    return flood


async def test_leader_killed_a_follower_leads_within_two_timeouts_and_nothing_runs_twice() -> None:
    async with (
        running_simulator(dataclasses.replace(FAST, max_num_seqs=4)) as sim,
        replicas(sim.url, gate={"waiting_target": 2}) as (_, servers),
    ):
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(client_for(s, user=f"u{i}")) for i, s in enumerate(servers)]
            flood = await _flood_under_way(clients, 60, max_tokens=30, under_way=6)
            await agent_of(servers[0]).kill()  # from here the others hear nothing from it
            killed_at = time.monotonic()
            stopping = asyncio.create_task(servers[0].stop(grace=0.0))  # its own calls end
            survivors = servers[1:]
            await eventually(lambda: any(agent_of(s).role is Role.LEADING for s in survivors), 5.0, "a new leader")
            took = time.monotonic() - killed_at
            await stopping
            await settled(survivors)
            outcomes = await _outcomes(flood)
        ids = engine_ids(sim.engine.stats())
    assert took <= 2 * TIMEOUT, f"a follower took the lead after {took:.2f}s"
    assert len(ids) == len(set(ids)), "a request was dispatched twice"
    for i, outcome in enumerate(outcomes):
        if i % 3 == 0:  # the dead replica's own calls
            assert (
                isinstance(outcome, grpc.aio.AioRpcError) and outcome.code() == grpc.StatusCode.UNAVAILABLE
            ) or not isinstance(outcome, BaseException), outcome
        else:
            assert not isinstance(outcome, BaseException), f"f{i} at a survivor failed: {outcome!r}"
    assert any(isinstance(outcomes[i], grpc.aio.AioRpcError) for i in range(0, 60, 3)), "the dead replica's calls ended"


async def test_follower_killed_its_mirrors_are_released_at_the_leader() -> None:
    async with (
        running_simulator(SimConfig(max_num_seqs=1, decode_base_ms=20.0)) as sim,
        replicas(sim.url, gate={"waiting_target": 1}) as (_, servers),
    ):
        leader, doomed = servers[0], servers[1]
        lead = leader.scheduler.dispatchers["m"]
        async with client_for(doomed, user="bob") as client:
            running = client.stream("m", "long", max_tokens=2000, ignore_eos=True, request_id="run")
            await first_delta(running)
            waiting = [client.stream("m", f"w{i}", max_tokens=2000, ignore_eos=True) for i in range(3)]
            await eventually(lambda: len(agent_of(leader).leader.mirrors) == 4, 5.0, "the leader mirrors all four")
            await kill(doomed)
            await eventually(lambda: not agent_of(leader).leader.mirrors, 2 * TIMEOUT + 1.0, "dead owner released")
            assert lead.backends[0].estimator.in_flight == 0, "the dead replica's engine budget is released"
            assert queue_depth(leader) == 0
            await eventually(lambda: sim.engine.stats()["running"] == 0, 3.0, "the engine aborted its requests")
            for call in [running, *waiting]:
                call.cancel()
        async with client_for(servers[2], user="carol") as other:
            response = await other.submit("m", "after", max_tokens=3, ignore_eos=True)
        assert response.usage.completion_tokens == 3


async def test_sigterm_of_the_leader_hands_the_lead_over_at_once() -> None:
    async with running_simulator(FAST) as sim, replicas(sim.url) as (_, servers):
        stopped_at = time.monotonic()
        await servers[0].stop(grace=0.2)
        survivors = servers[1:]
        leader = await settled(survivors)
        took = time.monotonic() - stopped_at
        assert took < TIMEOUT, f"handover took {took:.2f}s: no faster than the lease expiring"
        async with client_for(survivors[0] if leader is survivors[1] else survivors[1], user="x") as client:
            response = await client.submit("m", "still served", max_tokens=3, ignore_eos=True)
        assert response.usage.completion_tokens == 3


async def test_store_down_degrades_with_the_cap_then_back_to_shared_mode_losing_nothing() -> None:
    fallback = 6  # degraded: each of 3 replicas may hold 6 // 3 = 2 in flight at the engine
    async with (
        running_simulator(dataclasses.replace(FAST, max_num_seqs=8)) as sim,
        replicas(sim.url, gate={"waiting_target": 2, "fallback_max_in_flight": fallback}) as (store, servers),
    ):
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(client_for(s, user=f"u{i}")) for i, s in enumerate(servers)]
            flood = await _flood_under_way(clients, 90, max_tokens=40, under_way=3)
            store.down()
            await eventually(lambda: all(agent_of(s).role is Role.DEGRADED for s in servers), 3.0, "all degraded")
            registry = servers[1].scheduler.metrics.registry
            assert registry.get_sample_value("llmsched_cluster_role", {"role": "degraded"}) == 1
            assert registry.get_sample_value("llmsched_cluster_role", {"role": "follower"}) == 0
            assert (registry.get_sample_value("llmsched_cluster_store_errors_total") or 0) > 0
            await asyncio.sleep(0.3)  # a sampling window: what was in flight before the store went ends
            peak = 0
            for _ in range(30):  # sampled while degraded
                peak = max(peak, *(s.scheduler.dispatchers["m"].backends[0].estimator.in_flight for s in servers))
                await asyncio.sleep(0.01)
            assert peak <= fallback // 3, f"a degraded replica had {peak} in flight"
            assert sum(not t.done() for t in flood) > 0, "the flood outlasted the outage window"
            store.restart_empty()
            await settled(servers)
            outcomes = await _outcomes(flood)
        ids = engine_ids(sim.engine.stats())
    assert all(not isinstance(o, BaseException) for o in outcomes), [
        o for o in outcomes if isinstance(o, BaseException)
    ][:3]
    assert len(ids) == len(set(ids)) == 90, "every admitted request ran exactly once"


async def test_running_requests_are_adopted_by_the_next_leader() -> None:
    """One request runs from each follower; the leader hands over. The new leader counts both in its engine
    budget (its own as a local ticket, the other's adopted from the re-registration without a grant), and
    releases both when they end; the engine saw each once."""
    async with (
        running_simulator(SimConfig(decode_base_ms=10.0)) as sim,
        replicas(sim.url) as (_, servers),
        client_for(servers[1], user="a") as a,
        client_for(servers[2], user="b") as b,
    ):
        calls = [
            a.stream("m", "one", max_tokens=60, ignore_eos=True),
            b.stream("m", "two", max_tokens=60, ignore_eos=True),
        ]
        for call in calls:
            await first_delta(call)
        await servers[0].stop(grace=0.2)
        leader = await settled(servers[1:])
        estimator = leader.scheduler.dispatchers["m"].backends[0].estimator
        await eventually(lambda: estimator.in_flight == 2, 2.0, "the new leader counts both")
        (adopted,) = agent_of(leader).leader.mirrors.values()
        assert adopted.ticket.first_token_at is not None and adopted.ticket.completion_tokens > 0
        for call in calls:
            while await event_or_end(call) is not None:
                pass
        await eventually(lambda: estimator.in_flight == 0, 2.0, "both released")
        assert agent_of(leader).metrics.sent.labels("grant")._value.get() == 0, "adopted without a grant"
    ids = engine_ids(sim.engine.stats())
    assert len(ids) == len(set(ids)) == 2


async def test_a_store_hiccup_shorter_than_the_lease_gives_the_lead_back_to_its_holder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store stops answering for less than the lease's life and comes back with its state: the leader's
    lease (an earlier term's holder string) is still there. The leader takes the lead again at once rather
    than follow, and register its own requests with, its own earlier term (which once queued every one of its
    requests twice and wedged its dispatcher); no internal error, every request runs exactly once.

    The store's time stands still from before the leader is read until it leads again, so its lease cannot
    expire meanwhile however slow the machine: the hiccup is shorter than the lease by construction, the lead
    never moves by itself, and the leader can lead again only by freeing its own earlier term's lease."""
    async with (
        running_simulator(dataclasses.replace(FAST, max_num_seqs=4)) as sim,
        replicas(sim.url, gate={"waiting_target": 2}) as (store, servers),
    ):
        followed: list[str | None] = []

        def leading() -> list[ClusterAgent]:
            return [agent_of(s) for s in servers if agent_of(s).role is Role.LEADING]

        def lease_held_by_its_leader() -> bool:
            held = store.lease_now("m")
            return len(leading()) == 1 and held is not None and held[0] == leading()[0].holder_of("m")

        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(client_for(s, user=f"u{i}")) for i, s in enumerate(servers)]
            with store.time_stopped():
                await eventually(lease_held_by_its_leader, 10.0, "one leader, holding the lease in the store")
                (leader,) = leading()
                old_holder = leader.holder_of("m")
                follow = leader.follower.follow

                def recording_follow(lease: str, holder: str | None) -> None:
                    followed.append(holder)
                    follow(lease, holder)

                monkeypatch.setattr(leader.follower, "follow", recording_follow)
                flood = await _flood_under_way(clients, 45, max_tokens=20, under_way=3)
                store.down()
                await eventually(lambda: leader.role is Role.DEGRADED, 10.0, "the leader degraded")
                store.up = True  # back, state intact: the old lease has not expired
                held = store.lease_now("m")
                assert held is not None and held[0] == old_holder
                # No bound on "at once" is needed: the old lease never expires while the store's time stands
                # still, so a leader that waited for it, or followed it, would never lead again.
                await eventually(lambda: leader.role is Role.LEADING, 10.0, "the leader leads again")
                assert leader.holder_of("m") != old_holder
            await settled(servers)
            outcomes = await _outcomes(flood)
        ids = engine_ids(sim.engine.stats())
        errors = sum(
            s.scheduler.metrics.registry.get_sample_value("llmsched_internal_errors_total", {"component": c}) or 0
            for s in servers
            for c in ("dispatch", "cluster")
        )
    assert all(not isinstance(o, BaseException) for o in outcomes), [
        o for o in outcomes if isinstance(o, BaseException)
    ][:3]
    assert len(ids) == len(set(ids)) == 45, "every admitted request ran exactly once"
    assert errors == 0
    itself = f"{leader.name}/"
    assert not [h for h in followed if h and h.startswith(itself)], f"{leader.name} followed itself: {followed}"


class LosesOneCancel(FakeStore):
    """`members` waits until cancelled the first time, then returns as if nothing happened: what
    `asyncio.wait_for` does on Python 3.11 (redis-py writes under it) when a cancellation lands as the
    write completes."""

    def __init__(self, backend: FakeStoreBackend) -> None:
        super().__init__(backend)
        self.waiting = asyncio.Event()
        self.lost = 0

    async def members(self) -> list[str]:
        if not self.lost:
            self.waiting.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.lost += 1
        return await super().members()


async def test_a_replica_stops_even_when_its_heartbeat_loses_a_cancellation() -> None:
    stores: list[LosesOneCancel] = []

    def factory(_config: object, _registry: object) -> LosesOneCancel:
        stores.append(LosesOneCancel(FakeStoreBackend()))
        return stores[0]

    server = SchedulerServer(cluster_config("http://127.0.0.1:1", "r0"), store_factory=factory)
    await server.start()
    await asyncio.wait_for(stores[0].waiting.wait(), 5.0)  # the heartbeat sits in `members`
    started = time.monotonic()
    await asyncio.wait_for(server.stop(grace=0.0), 5.0)  # (on a hang, wait_for's own cancellation is lost too)
    took = time.monotonic() - started
    assert stores[0].lost == 1, "the heartbeat's first cancellation was lost"
    assert took < 1.0, f"the stop took {took:.1f}s"
    assert server.agent is None


async def test_a_late_inbox_read_is_read_again_not_taken_for_an_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    """A receive that runs past its time limit (StoreTimeout: the process's own loop too busy to read the
    answer) leaves the replica in its role and reads again; a receive that cannot reach the store at all
    (StoreUnavailable) degrades it at once."""
    async with (
        running_simulator(FAST) as sim,
        replicas(sim.url, count=2) as (_, servers),
    ):
        follower = agent_of(servers[1])
        store = follower.store
        receive = store.receive
        failures: list[Exception] = [StoreTimeout("late"), StoreTimeout("late again")]
        reads_after = asyncio.Event()
        roles: list[Role] = []
        apply = follower._apply

        def recording_apply(lease: LeaseState, role: Role, holder: str | None = None) -> None:
            roles.append(role)
            apply(lease, role, holder)

        monkeypatch.setattr(follower, "_apply", recording_apply)

        async def flaky_receive(me: str, timeout: float) -> list[bytes]:
            if failures:
                raise failures.pop(0)
            reads_after.set()
            return await receive(me, timeout)

        monkeypatch.setattr(store, "receive", flaky_receive)
        await asyncio.wait_for(reads_after.wait(), 5.0)
        assert Role.DEGRADED not in roles and follower.role is Role.FOLLOWING
        assert (servers[1].scheduler.metrics.registry.get_sample_value("llmsched_cluster_store_errors_total") or 0) >= 2
        failures.append(StoreUnavailable("refused"))
        reads_after.clear()
        await asyncio.wait_for(reads_after.wait(), 5.0)
        assert Role.DEGRADED in roles  # (the next heartbeat, which reaches the store, brings it back)


class AcquiresLate(FakeStore):
    """`acquire_lease` takes the lease, then answers too late (StoreTimeout), the first time only: a hung
    Redis that ran the script and whose answer missed the call's time limit."""

    def __init__(self, backend: FakeStoreBackend) -> None:
        super().__init__(backend)
        self.late = 0

    async def acquire_lease(self, lease: str, holder: str, ttl: float) -> bool:
        held = await super().acquire_lease(lease, holder, ttl)
        if held and not self.late:
            self.late += 1
            raise StoreTimeout("acquire_lease answered past its time limit")
        return held


class TakesNoFreeLease(FakeStore):
    """Never takes a free lease (another replica is always quicker): the test decides who leads."""

    async def acquire_lease(self, lease: str, holder: str, ttl: float) -> bool:
        held = self.b.lease_now(lease)
        return held is not None and held[0] == holder


async def test_a_lease_taken_by_a_call_answered_too_late_is_led_in_a_term_the_followers_register_with() -> None:
    """The leader dies; r1's acquire of its lease takes effect but answers past the time limit, so r1 goes
    degraded holding the lease. r2 follows r1's holder string at once and registers its request there, which
    r1, not leading, ignores. r1 must lead in a term of its own that r2 sees change and registers with again
    (leading again under the same holder string left r2's request waiting for a grant forever)."""
    async with running_simulator(FAST) as sim:
        store = FakeStoreBackend()
        handles: dict[str, FakeStore] = {}

        def factory(name: str) -> FakeStore:
            handles[name] = {"r1": AcquiresLate, "r2": TakesNoFreeLease}.get(name, FakeStore)(store)
            return handles[name]

        servers: list[SchedulerServer] = []
        try:
            for name in ("r0", "r1", "r2"):
                server = SchedulerServer(cluster_config(sim.url, name), store_factory=serving(factory(name)))
                await server.start()
                servers.append(server)
                if name == "r0":
                    await eventually(lambda: agent_of(servers[0]).role is Role.LEADING, 5.0, "r0 leading")
            await settled(servers)
            r1, r2 = agent_of(servers[1]), agent_of(servers[2])
            await kill(servers[0])
            late = handles["r1"]
            assert isinstance(late, AcquiresLate)
            await eventually(lambda: late.late == 1, 5.0, "r1's late acquire")
            async with client_for(servers[2], user="bob") as client:
                response = await asyncio.wait_for(
                    client.submit("m", "after the late acquire", max_tokens=3, ignore_eos=True), 10 * TIMEOUT + 5.0
                )
            assert response.usage.completion_tokens == 3
            assert r1.role is Role.LEADING and r2.follower.leader_of("m") == r1.holder_of("m")
        finally:
            await stop_all(servers, grace=0.2)


async def _leader_and_follower_through(
    handle: FakeStore, store: FakeStoreBackend, url: str, cluster: dict[str, float], servers: list[SchedulerServer]
) -> None:
    """Start r0, leading, and r1, whose store calls go through `handle`, into `servers` (the caller stops them)."""
    for name in ("r0", "r1"):
        config = cluster_config(url, name, cluster=cluster)
        server = SchedulerServer(config, store_factory=serving(handle if name == "r1" else FakeStore(store)))
        await server.start()
        servers.append(server)
        if name == "r0":
            await eventually(lambda: agent_of(servers[0]).role is Role.LEADING, 5.0, "r0 leading")
    await settled(servers)


class HeldStore(FakeStore):
    """A handle whose inbox reads can be held back (messages wait in the store) and whose heartbeat can be
    made to fail (each membership renewal answers too late) while everything else works."""

    def __init__(self, backend: FakeStoreBackend) -> None:
        super().__init__(backend)
        self.hold = False
        self.late_heartbeats = False

    async def receive(self, me: str, timeout: float) -> list[bytes]:
        if self.hold:
            await asyncio.sleep(min(timeout, 0.02))
            return []
        cursor = self.read_upto.get(me)
        got = await super().receive(me, timeout)
        if self.hold and cursor is not None:  # held while this read waited: it returns nothing after all
            self.read_upto[me] = cursor
            return []
        return got

    async def renew(self, name: str, token: str, ttl: float) -> bool:
        if self.late_heartbeats:
            raise StoreTimeout("renew answered past its time limit")
        return await super().renew(name, token, ttl)

    async def join(self, name: str, token: str, ttl: float) -> None:
        if self.late_heartbeats:
            raise StoreTimeout("join answered past its time limit")
        await super().join(name, token, ttl)


async def test_a_grant_reaching_a_degraded_owner_does_not_hold_the_leaders_budget_for_ever() -> None:
    """The leader grants a follower's request while the follower is degraded for a moment (its heartbeat
    answered too late, its inbox still read): the follower runs the request alone and it ends before the
    follower follows again. The leader must not keep its mirror, granted and counted in the engine budget,
    for ever: the follower tells a leader it does not follow that the request is not its to run."""
    async with running_simulator(FAST) as sim:
        store = FakeStoreBackend()
        handle = HeldStore(store)
        servers: list[SchedulerServer] = []
        try:
            # a membership that outlives the test's degraded moment (the leader releases a dead owner's
            # mirrors, which would hide the one kept by mistake)
            cluster = {"admission_wait_seconds": 0.2, "heartbeat_timeout_seconds": 30.0}
            await _leader_and_follower_through(handle, store, sim.url, cluster, servers)
            leader, follower = agent_of(servers[0]), agent_of(servers[1])
            handle.hold = True  # the Verdict and the Grant wait in r1's inbox
            async with client_for(servers[1], user="bob") as client:
                call = asyncio.create_task(client.submit("m", "granted while degraded", max_tokens=3, ignore_eos=True))
                await eventually(
                    lambda: any(m.grant is not None for m in leader.leader.mirrors.values()), 5.0, "the grant sent"
                )
                handle.late_heartbeats = True
                await eventually(lambda: follower.role is Role.DEGRADED, 5.0, "r1 degraded")
                response = await asyncio.wait_for(call, 10.0)  # run by r1 alone, under its degraded cap
                assert response.usage.completion_tokens == 3 and follower.role is Role.DEGRADED
                handle.hold = False  # r1 reads the Grant while degraded
                await eventually(lambda: follower.metrics.stale_grants._value.get() == 1, 5.0, "the grant read")
                assert follower.role is Role.DEGRADED
                handle.late_heartbeats = False
                await settled(servers)
            estimator = servers[0].scheduler.dispatchers["m"].backends[0].estimator
            await eventually(lambda: not leader.leader.mirrors, 5.0, "the leader's mirror released")
            assert estimator.in_flight == 0
        finally:
            await stop_all(servers, grace=0.2)


class LateLeaseAnswer(FakeStore):
    """While `late` is set, `acquire_lease` takes the lease at once but its answer waits for `answer`: a
    loaded replica whose store has applied the take while the reply is still on its way, so the others read
    it as the lease's holder (and register with it) before it knows it leads."""

    def __init__(self, backend: FakeStoreBackend) -> None:
        super().__init__(backend)
        self.late = False
        self.waiting = asyncio.Event()
        self.answer = asyncio.Event()

    async def acquire_lease(self, lease: str, holder: str, ttl: float) -> bool:
        took = await super().acquire_lease(lease, holder, ttl)
        if self.late:
            self.waiting.set()
            await self.answer.wait()
        return took


class CutOff(FakeStore):
    """A handle that cannot reach the store while `cut` is set (its replica's network to Redis is down)."""

    def __init__(self, backend: FakeStoreBackend) -> None:
        super().__init__(backend)
        self.cut = False

    def _op(self) -> None:
        if self.cut:
            raise StoreUnavailable("cut off from the fake store")
        super()._op()


async def test_requests_registered_with_a_new_leader_before_it_knows_it_leads_are_not_lost() -> None:
    """A follower reads the new holder of the lease and registers its queued requests with it while the new
    leader still waits for the answer to its take of the lease. The leader handles them as the leader it is
    about to be, so they are granted and run; none waits for a grant that never comes.

    The order is forced: the store's time stands still throughout (no lease expires: r0 leads until it frees
    its lease), and r1 is cut off from the store (gating alone) until r0's take is in the store, so its
    registrations are the first thing r0's inbox reads while r0 waits for the answer."""
    backend = FakeStoreBackend()
    late, cut_off = LateLeaseAnswer(backend), CutOff(backend)
    gate = {"waiting_target": 1, "fallback_max_in_flight": 2}
    servers: list[SchedulerServer] = []
    with backend.time_stopped():
        async with running_simulator(SimConfig(max_num_seqs=1, decode_base_ms=10.0)) as sim:
            try:
                for name, handle in (("r0", late), ("r1", cut_off)):
                    server = SchedulerServer(cluster_config(sim.url, name, gate=gate), store_factory=serving(handle))
                    await server.start()
                    servers.append(server)
                    await eventually(lambda: agent_of(servers[0]).role is Role.LEADING, 5.0, "r0 leading")
                await settled(servers)
                leader, follower = agent_of(servers[0]), agent_of(servers[1])
                async with client_for(servers[1], user="bob") as client:
                    calls = [
                        asyncio.create_task(
                            client.submit("m", f"q{i}", max_tokens=30, ignore_eos=True, request_id=f"q{i}")
                        )
                        for i in range(4)
                    ]
                    await eventually(lambda: sim.engine.stats()["running"] == 1, 5.0, "one request at the engine")
                    cut_off.cut = True  # from here r1 sends r0 nothing
                    await eventually(lambda: follower.role is Role.DEGRADED, 10.0, "r1 degraded")
                    await eventually(
                        lambda: late.read_upto.get("r0") == (backend.generation, backend.end_of("r0")),
                        10.0,
                        "r0 read all r1 sent it",
                    )
                    backend.down()
                    await eventually(lambda: leader.role is Role.DEGRADED, 10.0, "r0 degraded")
                    late.late = True
                    backend.up = True
                    await asyncio.wait_for(late.waiting.wait(), 10.0)  # r0's take is in the store, unanswered
                    held = backend.lease_now("m")
                    assert held is not None and held[0] == leader.holder_of("m")
                    registrations = backend.end_of("r0") + 1  # r1's first entry in r0's inbox: its Admits
                    cut_off.cut = False
                    await eventually(lambda: follower.follower.leader_of("m") == held[0], 10.0, "r1 follows r0")
                    await eventually(
                        lambda: late.read_upto.get("r0", (0, 0)) >= (backend.generation, registrations),
                        10.0,
                        "r0 read r1's registrations",
                    )
                    assert leader.role is not Role.LEADING
                    late.late = False
                    late.answer.set()
                    await eventually(lambda: leader.role is Role.LEADING, 10.0, "r0 leads")
                    done, pending = await asyncio.wait(calls, timeout=20.0)
                    for call in pending:
                        call.cancel()
                    assert not pending, f"{len(pending)} of r1's requests never granted"
                    for call in done:
                        assert call.result().usage.completion_tokens == 30
            finally:
                await stop_all(servers)


async def test_requests_that_end_while_their_owner_is_degraded_leave_no_mirror_at_its_leader() -> None:
    """A follower degraded for less than its membership's life (its heartbeat answered too late) stays a member,
    so its leader keeps its mirrors; meanwhile one of its requests ends (the client leaves) and another runs on.
    Once it follows the same leader again, the leader holds the live one's mirror alone: the ended one is
    neither in flight nor in the engine budget any more, and the live one's mirror is not ended by mistake."""
    async with running_simulator(SimConfig(max_num_seqs=4, decode_base_ms=20.0)) as sim:
        store = FakeStoreBackend()
        handle = HeldStore(store)
        servers: list[SchedulerServer] = []
        try:
            # a membership that outlives the degraded moment (the leader releases a dead owner's mirrors)
            await _leader_and_follower_through(handle, store, sim.url, {"heartbeat_timeout_seconds": 30.0}, servers)
            leader, follower = agent_of(servers[0]), agent_of(servers[1])
            estimator = servers[0].scheduler.dispatchers["m"].backends[0].estimator

            def mirrored() -> set[str]:
                return {m.ticket.request.client_request_id for m in leader.leader.mirrors.values()}

            async with client_for(servers[1], user="bob") as client:
                gone = client.stream("m", "left while degraded", max_tokens=2000, ignore_eos=True, request_id="gone")
                kept = client.stream("m", "runs throughout", max_tokens=2000, ignore_eos=True, request_id="kept")
                await first_delta(gone)
                await first_delta(kept)
                await eventually(lambda: mirrored() == {"gone", "kept"}, 5.0, "both mirrored")
                handle.late_heartbeats = True
                await eventually(lambda: follower.role is Role.DEGRADED, 5.0, "r1 degraded")
                gone.cancel()
                local = servers[1].scheduler.dispatchers["m"].cluster
                await eventually(
                    lambda: [t.request.client_request_id for t in local.live_tickets()] == ["kept"], 5.0, "gone ended"
                )
                assert follower.role is Role.DEGRADED
                handle.late_heartbeats = False
                await settled(servers)
                await eventually(lambda: mirrored() == {"kept"}, 5.0, "the ended request's mirror released")
                assert estimator.in_flight == 1, "the engine budget counts the live request alone"
                kept.cancel()
                await eventually(lambda: not leader.leader.mirrors, 5.0, "the live request's end reported")
                assert estimator.in_flight == 0
        finally:
            await stop_all(servers, grace=0.2)


async def test_a_roster_ends_only_its_owners_older_mirrors_it_does_not_name_and_only_once_whole() -> None:
    """The leader's side of a roster: a part missing or out of order, another model's roster or another owner's
    ends nothing; a whole one ends the owner's mirrors it does not name, but not one registered after its first
    part arrived (that request was admitted after the owner sent the roster)."""
    async with (
        running_simulator(SimConfig(max_num_seqs=4, decode_base_ms=20.0)) as sim,
        replicas(sim.url, count=2) as (_, servers),
    ):
        leader = agent_of(servers[0]).leader
        estimator = servers[0].scheduler.dispatchers["m"].backends[0].estimator

        def mirrored() -> set[str]:
            return {m.ticket.request.client_request_id for m in leader.mirrors.values()}

        async with client_for(servers[1], user="bob") as client:
            old = client.stream("m", "registered before", max_tokens=2000, ignore_eos=True, request_id="old")
            await first_delta(old)
            await eventually(lambda: mirrored() == {"old"}, 5.0, "old mirrored")
            leader.on_roster(Roster("r1", ["m"], [], 1, 2))  # its first part missing
            leader.on_roster(Roster("r1", ["m"], [], 0, 3))
            leader.on_roster(Roster("r1", ["m"], [], 2, 3))  # its second part missing
            leader.on_roster(Roster("r1", ["m"], [], 1, 3))  # what is left of it
            leader.on_roster(Roster("r1", ["other"], [], 0, 1))
            leader.on_roster(Roster("r2", ["m"], [], 0, 1))
            assert mirrored() == {"old"}
            leader.on_roster(Roster("r1", ["m"], [], 0, 2))
            new = client.stream("m", "registered after", max_tokens=2000, ignore_eos=True, request_id="new")
            await first_delta(new)
            await eventually(lambda: mirrored() == {"old", "new"}, 5.0, "new mirrored")
            leader.on_roster(Roster("r1", ["m"], [], 1, 2))
            assert mirrored() == {"new"}
            assert estimator.in_flight == 1
            old.cancel()
            new.cancel()
            await eventually(lambda: not leader.mirrors, 5.0, "new's end reported")
            assert estimator.in_flight == 0

"""Three scheduler replica PROCESSES on a real redis-server in front of one simulator ("Real parts
in tests" and "Failure"): one engine budget, kill -9 of a follower and of the leader, SIGTERM of the leader,
Redis stopped and restarted empty, a duplicate replica name. Clients call the replicas round robin over
gRPC; roles are read from each replica's /metrics; what reached the engine, from the simulator's journal.

Heartbeat 0.2 s, timeout 0.8 s (`live.HEARTBEAT`, `live.TIMEOUT`; the SIGTERM test's leases live longer,
`HANDOVER_LEASE`). Floods are short (tens of requests of at most 30 tokens on a fast simulator) so the file
stays within about a minute and a half on two cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import pytest

from backends.metrics import MetricSamples
from backends.sim import SimConfig, SimServer, running_simulator
from clients import SchedulerClient, error_reason, pb
from scheduler_svc.cluster.modes import degraded_cap
from scheduler_svc.config import ClusterConfig, GateConfig, ModelConfig
from tests.cluster.live import (
    HEARTBEAT,
    START_SECONDS,
    TIMEOUT,
    EngineLog,
    Replica,
    RoleWatch,
    cluster,
    leading,
    metric,
    one_leader,
    spawn_replica,
)
from tests.cluster.redis_server import RedisServer
from tests.helpers import eventually

FAST = SimConfig(decode_base_ms=2.0, decode_per_seq_ms=0.5)
WAITING_TARGET = 2
WAITING_SLACK = 1  # a grant in flight while the leader's reading of the engine is a scrape old
USERS = 4
ABORT_NOTICE_SECONDS = 0.1  # the simulator (in this loaded test process) reads a closed connection this late
LONG_EVERY = 4
# Requests the survivors get right after a kill: the flood's own may all have reached the engine by the time
# a victim with a long answer live is found (picked late, the survivors' share is done), and the dispatch
# that must go on after the kill needs work to show it.
AFTER_KILL = 6
LONG_TOKENS = 150  # about 0.6 s at the engine: outlives the pick-to-kill race (a 30-token answer can end in it)
# The SIGTERM test's lease life: a lead handed over (a store round trip and a message, half a second at worst
# on a loaded two-core machine) is told from one that moved when the lease expired by a wide margin.
HANDOVER_LEASE = 4.0


@dataclass
class Flood:
    """`count` Submit calls, request i sent to replica i % 3 as user u{i % USERS}; `owner[id]`: its replica;
    `long`: the ids given a long answer (none unless the flood asks for them)."""

    tasks: dict[str, asyncio.Task[object]]
    owner: dict[str, str]
    long: set[str]
    replicas: dict[str, Replica]

    def done(self) -> int:
        return sum(t.done() for t in self.tasks.values())

    async def outcomes(self, timeout: float = 30.0) -> dict[str, object]:
        """Every call's outcome; a call still open after `timeout` fails the test, naming it and its replica."""
        _, pending = await asyncio.wait(self.tasks.values(), timeout=timeout)
        if pending:
            open_calls = sorted(f"{rid}@{self.owner[rid]}" for rid, task in self.tasks.items() if task in pending)
            holders = sorted({self.owner[rid] for rid, task in self.tasks.items() if task in pending})
            logs = "\n".join(f"--- {name}'s log:\n{self.replicas[name].log_tail()}" for name in holders)
            raise AssertionError(f"{len(open_calls)} call(s) still open after {timeout}s: {open_calls}\n{logs}")
        return {rid: task.exception() or task.result() for rid, task in self.tasks.items()}

    def of(self, name: str) -> list[str]:
        return [rid for rid, owner in self.owner.items() if owner == name]


@contextlib.asynccontextmanager
async def flood(
    replicas: list[Replica], count: int, max_tokens: int, prefix: str = "f", long_tokens: int | None = None
) -> AsyncIterator[Flood]:
    """With `long_tokens`, every LONG_EVERY-th request asks for that many tokens instead (each replica gets
    some, since LONG_EVERY and the replica count are coprime): a kill test picks its victim while one of them
    runs, so the victim still has a request at the engine when the kill lands."""
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            (r, u): await stack.enter_async_context(SchedulerClient(replicas[r].target, user=f"u{u}"))
            for r in range(len(replicas))
            for u in range(USERS)
        }
        tasks: dict[str, asyncio.Task[object]] = {}
        owner: dict[str, str] = {}
        long: set[str] = set()
        for i in range(count):
            rid, r = f"{prefix}{i}", i % len(replicas)
            tokens = max_tokens
            if long_tokens is not None and i % LONG_EVERY == LONG_EVERY - 1:
                tokens = long_tokens
                long.add(rid)
            client = clients[(r, i % USERS)]
            call = client.submit("m", f"{rid} flood", max_tokens=tokens, ignore_eos=True, request_id=rid)
            tasks[rid] = asyncio.create_task(call)
            owner[rid] = replicas[r].name
        try:
            yield Flood(tasks, owner, long, {r.name: r for r in replicas})
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)


def survivors_of(replicas: list[Replica], doomed: Replica) -> list[Replica]:
    return [r for r in replicas if r is not doomed]


def ok(outcome: object) -> bool:
    return not isinstance(outcome, BaseException)


def code(outcome: object) -> grpc.StatusCode | None:
    return outcome.code() if isinstance(outcome, grpc.aio.AioRpcError) else None


def by_role(replicas: list[Replica], watch: RoleWatch, role: str) -> list[Replica]:
    return [r for r in replicas if watch.now.get(r.name) == role]


@contextlib.asynccontextmanager
async def simulator(tmp_path: Path, max_num_seqs: int = 4) -> AsyncIterator[tuple[SimServer, Path]]:
    journal = tmp_path / "engine.jsonl"
    async with running_simulator(dataclasses.replace(FAST, max_num_seqs=max_num_seqs, journal=str(journal))) as sim:
        yield sim, journal


def no_request_twice(engine: EngineLog) -> None:
    twice = {rid: n for rid, n in Counter(engine.received()).items() if n > 1}
    assert not twice, f"dispatched to the engine more than once: {twice}"


async def test_one_engine_budget_for_a_flood_over_three_replica_processes(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The simulator's own waiting queue stays within the gate's target + WAITING_SLACK while three
    processes take a flood round robin (three independent schedulers would each fill it to the target)."""
    async with (
        simulator(tmp_path) as (sim, journal),
        cluster(tmp_path, sim.url, redis_server.url, waiting_target=WAITING_TARGET) as (replicas, _),
    ):
        sampled: list[float] = []

        async def sample() -> None:  # the engine's num_requests_waiting as a Prometheus scraper sees it
            async with aiohttp.ClientSession() as session:
                while True:
                    async with session.get(sim.url + "/metrics") as response:
                        text = await response.text()
                    sampled.append(MetricSamples.parse(text).total("vllm:num_requests_waiting") or 0.0)
                    await asyncio.sleep(0.01)

        sampler = asyncio.create_task(sample())
        async with flood(replicas, 45, max_tokens=20) as calls:
            outcomes = await calls.outcomes()
        sampler.cancel()
        stats = sim.engine.stats()
    engine = EngineLog.read(journal)
    failed = {rid: o for rid, o in outcomes.items() if not ok(o)}
    assert not failed, f"calls failed: {failed}"
    assert all(isinstance(o, pb.SubmitResponse) and o.usage.completion_tokens == 20 for o in outcomes.values())
    assert sorted(engine.received()) == sorted(outcomes), "each request reached the engine exactly once"
    assert len(sampled) >= 20, f"only {len(sampled)} samples of the engine's metrics"
    exact = stats["max_waiting_seen"]
    print(f"engine waiting: sampled max {max(sampled)} over {len(sampled)} samples, exact max {exact}")
    assert max(sampled) <= WAITING_TARGET + WAITING_SLACK, f"sampled waiting reached {max(sampled)}"
    assert exact <= WAITING_TARGET + WAITING_SLACK, f"the engine's waiting queue reached {exact}"


async def _mid_flood(
    calls: Flood, engine_at: Path, replicas: list[Replica], watch: RoleWatch, role: str, done: int
) -> tuple[Replica, set[str]]:
    """Wait until `done` calls are done, the cluster is settled (one leader, the others following) and a
    replica in `role` (by its gauge, now: under load the lead can move before the failure) has requests live
    at the engine, a long one among them if the flood has long ones; that replica and those request ids."""

    def pick() -> tuple[Replica, set[str]] | None:
        roles = watch.now
        if calls.done() < done or len(roles) != len(replicas) or not one_leader(roles):
            return None
        engine = EngineLog.read(engine_at)
        ended = engine.ended("finished") | engine.ended("aborted") | engine.ended("failed")
        for replica in by_role(replicas, watch, role):
            live = {rid for rid in engine.received() if calls.owner.get(rid) == replica.name and rid not in ended}
            if live and (not calls.long or live & calls.long):
                return replica, live
        return None

    await eventually(lambda: pick() is not None, 20.0, f"a {role} running mid-flood")
    picked = pick()
    assert picked is not None
    return picked


async def aborted_at_engine(journal: Path, ids: list[str], killed_at: float) -> set[str]:
    """Wait until none of `ids` (a killed replica's) is left at the engine; those the engine aborted. None
    may finish normally later than ABORT_NOTICE_SECONDS after the kill (wall clock `killed_at`): its
    connections closed, so the engine stops them once it reads that (a request of 30 tokens runs ~0.2 s)."""
    owned = set(ids)

    def left() -> set[str]:
        engine = EngineLog.read(journal)
        ended = engine.ended("finished") | engine.ended("aborted") | engine.ended("failed")
        return (set(engine.received()) & owned) - ended

    await eventually(lambda: not left(), 5.0, "the killed replica's requests ended at the engine")
    engine = EngineLog.read(journal)
    late = {
        e["id"]
        for e in engine.events
        if e["event"] == "finished"
        and float(e["t"]) > killed_at + ABORT_NOTICE_SECONDS
        and e["id"].split("~")[0] in owned
    }
    assert not late, f"ran to the end at the engine after their replica was killed: {late}"
    aborted = engine.ended("aborted") & owned
    assert aborted, "none of the killed replica's requests was at the engine to abort"
    return aborted


def dispatch_gaps(engine: EngineLog, since: float, ids: set[str]) -> tuple[float, float]:
    """Seconds from `since` (wall clock) to the first engine arrival of one of `ids`, and the longest gap
    between two consecutive arrivals of `ids` after `since`."""
    times = sorted(
        float(e["t"])
        for e in engine.events
        if e["event"] == "received" and float(e["t"]) > since and e["id"].split("~", 1)[0] in ids
    )
    assert times, "nothing reached the engine after the failure"
    points = [since, *times]
    return times[0] - since, max(b - a for a, b in itertools.pairwise(points))


async def test_follower_killed_mid_flood(tmp_path: Path, redis_server: RedisServer) -> None:
    async with (
        simulator(tmp_path) as (sim, journal),
        cluster(tmp_path, sim.url, redis_server.url, waiting_target=WAITING_TARGET) as (replicas, watch),
    ):
        async with flood(replicas, 60, max_tokens=30, long_tokens=LONG_TOKENS) as calls:
            doomed, _ = await _mid_flood(calls, journal, replicas, watch, "follower", done=6)
            doomed.kill9()
            killed_at = time.time()
            async with flood(survivors_of(replicas, doomed), AFTER_KILL, max_tokens=30, prefix="g") as after:
                outcomes = await calls.outcomes()
                outcomes.update(await after.outcomes())
        survivors_ids = {rid for rid, o in calls.owner.items() if o != doomed.name} | set(after.owner)
        # The dead process's engine requests end when its connections close.
        aborted = await aborted_at_engine(journal, calls.of(doomed.name), killed_at)
        async with aiohttp.ClientSession() as session:
            # Its budget and queue entries at the leader (and anywhere else): released once its membership
            # expires; the survivors' own calls are all over by now.
            async def held() -> list[float | None]:
                survivors = [r for r in replicas if r.alive]
                names = ("llmsched_backend_in_flight", "llmsched_queue_depth")
                return [await metric(session, r, name) for r in survivors for name in names]

            deadline = time.monotonic() + 2 * TIMEOUT
            while any(value != 0 for value in await held()):
                assert time.monotonic() < deadline, f"budget or queue entries still held: {await held()}"
                await asyncio.sleep(0.05)  # another process's gauges: no event to wait on
        running = sim.engine.stats()["running"]
    engine = EngineLog.read(journal)
    first, gap = dispatch_gaps(engine, killed_at, survivors_ids)
    print(f"follower killed: {len(aborted)} aborted at the engine; next dispatch {first:.3f}s, longest gap {gap:.3f}s")
    assert gap <= 2 * TIMEOUT, f"dispatch stalled {gap:.2f}s after the kill"
    assert running == 0
    no_request_twice(engine)
    for rid, outcome in outcomes.items():
        if calls.owner.get(rid) == doomed.name:
            assert ok(outcome) or code(outcome) == grpc.StatusCode.UNAVAILABLE, f"{rid}: {outcome!r}"
        else:
            assert ok(outcome), f"{rid} at a survivor failed: {outcome!r}"
    assert any(code(outcomes[rid]) == grpc.StatusCode.UNAVAILABLE for rid in calls.of(doomed.name))


async def test_leader_killed_mid_flood(tmp_path: Path, redis_server: RedisServer) -> None:
    async with (
        simulator(tmp_path) as (sim, journal),
        cluster(tmp_path, sim.url, redis_server.url, waiting_target=WAITING_TARGET) as (replicas, watch),
    ):
        async with flood(replicas, 60, max_tokens=30, long_tokens=LONG_TOKENS) as calls:
            doomed, _ = await _mid_flood(calls, journal, replicas, watch, "leader", done=6)
            doomed.kill9()
            killed_at = time.time()
            async with flood(survivors_of(replicas, doomed), AFTER_KILL, max_tokens=30, prefix="g") as after:
                await watch.until(
                    lambda roles: len(roles) == 2 and one_leader(roles), 5.0, "a new leader by the gauges"
                )
                outcomes = await calls.outcomes()
                outcomes.update(await after.outcomes())
        aborted = await aborted_at_engine(journal, calls.of(doomed.name), killed_at)
    engine = EngineLog.read(journal)
    survivors_ids = {rid for rid, o in calls.owner.items() if o != doomed.name} | set(after.owner)
    first, gap = dispatch_gaps(engine, killed_at, survivors_ids)
    # When the next leader took over, by its own log (the gauge poll adds the loaded test process's lag).
    took = min(t for r in replicas if r is not doomed for t in r.became("leading") if t > killed_at) - killed_at
    print(
        f"leader killed: {len(aborted)} aborted at the engine; new leader after {took:.3f}s; "
        f"next dispatch {first:.3f}s, longest gap {gap:.3f}s"
    )
    assert took <= 2 * TIMEOUT, f"a new leader after {took:.2f}s"
    assert gap <= 2 * TIMEOUT, f"dispatch stalled {gap:.2f}s after the kill"
    no_request_twice(engine)
    for rid, outcome in outcomes.items():
        if calls.owner.get(rid) == doomed.name:
            assert ok(outcome) or code(outcome) == grpc.StatusCode.UNAVAILABLE, f"{rid}: {outcome!r}"
        else:
            assert ok(outcome), f"{rid} at a survivor failed: {outcome!r}"


async def test_leader_sigterm_hands_the_lead_over_at_once(tmp_path: Path, redis_server: RedisServer) -> None:
    async with (
        simulator(tmp_path) as (sim, journal),
        cluster(
            tmp_path, sim.url, redis_server.url, heartbeat_timeout=HANDOVER_LEASE, waiting_target=WAITING_TARGET
        ) as (replicas, watch),
    ):
        async with flood(replicas, 60, max_tokens=30) as calls:
            old, _ = await _mid_flood(calls, journal, replicas, watch, "leader", done=4)
            old.sigterm()
            stopped_at, stopped_wall = time.monotonic(), time.time()
            seen_at = await watch.until(  # returns at the first sample that shows it; `took` below is the claim
                lambda roles: any(role == "leader" for name, role in roles.items() if name != old.name),
                2 * HANDOVER_LEASE,
                "another replica's gauge says leader",
            )
            outcomes = await calls.outcomes()
        rc = await asyncio.to_thread(old.popen.wait, 10)
    # When the next leader took over, by its own log: the gauge poll above adds the loaded test process's lag.
    took = min(t for r in replicas if r is not old for t in r.became("leading") if t > stopped_wall) - stopped_wall
    engine = EngineLog.read(journal)
    print(f"SIGTERM: another replica leads after {took:.3f}s (its gauge seen after {seen_at - stopped_at:.3f}s)")
    assert took < HANDOVER_LEASE / 2, (
        f"the lead moved after {took:.2f}s: not at once (the lease lasts {HANDOVER_LEASE}s)"
    )
    assert rc == 0, f"the old leader exited with {rc}: {old.log_tail()}"
    no_request_twice(engine)
    shut = [rid for rid in calls.of(old.name) if code(outcomes[rid]) == grpc.StatusCode.UNAVAILABLE]
    for rid in calls.of(old.name):
        outcome = outcomes[rid]
        assert ok(outcome) or rid in shut, f"{rid}: {outcome!r}"
    for rid in shut:
        outcome = outcomes[rid]
        assert isinstance(outcome, grpc.aio.AioRpcError)
        assert error_reason(outcome) == "SHUTTING_DOWN", f"{rid}: {outcome!r}"
    assert shut, "none of the old leader's queued calls ended SHUTTING_DOWN"
    failed = {rid: o for rid, o in outcomes.items() if calls.owner[rid] != old.name and not ok(o)}
    assert not failed, f"calls at the other replicas failed: {failed}"


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_redis_down_and_restarted_empty_mid_flood(tmp_path: Path, redis_server: RedisServer, how: str) -> None:
    """Redis stopped (SIGTERM) or killed (-9) mid-flood: each replica gates alone with max(1, cap // 3) in
    flight; every call completes; back to one leader by themselves once Redis answers again (empty)."""
    cap = 6
    per_replica = degraded_cap(ClusterConfig(), ModelConfig(name="m", gate=GateConfig(fallback_max_in_flight=cap)), 3)
    async with (
        simulator(tmp_path, max_num_seqs=8) as (sim, journal),
        cluster(tmp_path, sim.url, redis_server.url, fallback_max_in_flight=cap) as (replicas, watch),
        flood(replicas, 90, max_tokens=30) as calls,
    ):
        await eventually(lambda: calls.done() >= 10, 20.0, "the flood under way")
        redis_server.stop() if how == "stop" else redis_server.kill()
        stopped_at = time.monotonic()
        degraded_at = await watch.until(
            lambda roles: len(roles) == 3 and all(r == "degraded" for r in roles.values()), 5.0, "all degraded"
        )
        degraded_wall = time.time()
        done_then = calls.done()
        await eventually(lambda: calls.done() >= done_then + 10, 20.0, "serving while degraded")
        redis_server.restart_empty()
        back_wall, back_at = time.time(), time.monotonic()
        shared_at = await watch.until(lambda roles: len(roles) == 3 and one_leader(roles), 10.0, "one leader")
        outcomes = await calls.outcomes()
    engine = EngineLog.read(journal)
    in_window = [t for t in engine.times("received") if degraded_wall < t < back_wall]
    peak = engine.peak_live(received_after=degraded_wall, received_before=back_wall)
    print(
        f"redis down: all degraded after {degraded_at - stopped_at:.3f}s; {len(in_window)} dispatched degraded, "
        f"engine peak {peak} (caps allow {3 * per_replica}); one leader {shared_at - back_at:.3f}s after restart"
    )
    assert in_window, "nothing was dispatched while degraded"
    assert peak <= 3 * per_replica, f"{peak} at the engine at once while degraded (caps: 3 x {per_replica})"
    assert shared_at - back_at <= TIMEOUT + 3 * HEARTBEAT, f"shared mode again after {shared_at - back_at:.2f}s"
    failed = {rid: o for rid, o in outcomes.items() if not ok(o)}
    assert not failed, f"admitted calls lost: {failed}"
    no_request_twice(engine)
    assert sorted(engine.received()) == sorted(outcomes)


async def test_a_second_process_with_a_live_replicas_name_refuses_to_start(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    async with (
        simulator(tmp_path) as (sim, _),
        cluster(tmp_path, sim.url, redis_server.url, names=("r1",)) as (replicas, _),
    ):
        twin = spawn_replica("r1", tmp_path, sim.url, redis_server.url)
        rc = await asyncio.to_thread(twin.popen.wait, START_SECONDS)
        assert replicas[0].alive
    assert rc != 0
    assert "replica name r1 is held by another live replica" in twin.log_tail(), twin.log_tail()


async def leaders_spread(replicas: list[Replica], models: tuple[str, ...], timeout: float) -> dict[str, Replica]:
    """Wait until each model is led by exactly one of `replicas` and no replica leads two (by the replicas'
    `llmsched_cluster_leading` gauges); model -> its leader. Every one of `replicas` must stay alive."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
        while True:
            for replica in replicas:
                assert replica.alive, f"{replica.name} exited with {replica.popen.returncode}: {replica.log_tail()}"
            answers = await asyncio.gather(*(leading(session, r, models) for r in replicas))
            led = list(zip(replicas, answers, strict=True))
            holders = {m: [r for r, ms in led if ms is not None and m in ms] for m in models}
            if all(len(h) == 1 for h in holders.values()) and all(ms is not None and len(ms) <= 1 for _, ms in led):
                return {m: h[0] for m, h in holders.items()}
            if time.monotonic() > deadline:
                names = {m: [r.name for r in h] for m, h in holders.items()}
                raise AssertionError(f"models not spread over the replicas within {timeout}s: {names}")
            await asyncio.sleep(0.02)  # sampling other processes' gauges: no event to wait on


async def test_the_leader_of_one_model_killed_mid_flood_leaves_the_other_models_leader_leading(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Models a and b on three replica processes: each model led by its own replica, on its own lease key in
    Redis. kill -9 of a's leader mid-flood: a's lead moves to a survivor within 2 x the heartbeat timeout; b's
    leader logs no role change on b's lease and keeps dispatching b meanwhile; nothing reaches the engine
    twice; every call at a survivor succeeds, the dead replica's end OK or UNAVAILABLE."""
    models = ("a", "b")
    async with simulator(tmp_path) as (sim, journal):
        replicas = [
            spawn_replica(name, tmp_path, sim.url, redis_server.url, models=models, waiting_target=WAITING_TARGET)
            for name in ("r1", "r2", "r3")
        ]
        try:
            led = await leaders_spread(replicas, models, START_SECONDS)
            doomed, keeper = led["a"], led["b"]
            survivors = survivors_of(replicas, doomed)
            async with contextlib.AsyncExitStack() as stack:
                clients = [await stack.enter_async_context(SchedulerClient(r.target, user="u")) for r in replicas]
                model_of = {f"f{i}": models[i % 2] for i in range(48)}
                owner = {rid: replicas[i % 3] for i, rid in enumerate(model_of)}
                calls = {
                    rid: asyncio.create_task(
                        clients[i % 3].submit(model_of[rid], rid, max_tokens=30, ignore_eos=True, request_id=rid)
                    )
                    for i, rid in enumerate(model_of)
                }
                await eventually(lambda: sum(t.done() for t in calls.values()) >= 6, 30.0, "the flood under way")
                doomed.kill9()
                killed_at = time.time()
                moved = await leaders_spread(survivors, models, 5.0)
                outcomes = dict(zip(calls, await asyncio.gather(*calls.values(), return_exceptions=True), strict=True))
        finally:
            for replica in replicas:
                if replica.alive:
                    replica.popen.kill()
                replica.popen.wait()
    engine = EngineLog.read(journal)
    no_request_twice(engine)
    took = min(t for r in survivors for t in r.became("leading", "a") if t > killed_at) - killed_at
    b_received = [
        float(e["t"])
        for e in engine.events
        if e["event"] == "received" and model_of.get(e["id"].split("~", 1)[0]) == "b" and killed_at < float(e["t"])
    ]
    print(f"model a's leader killed: a led again after {took:.3f}s; b's arrivals meanwhile {len(b_received)}")
    assert moved["b"] is keeper
    assert took <= 2 * TIMEOUT, f"model a led again after {took:.2f}s"
    assert [c for c in keeper.role_changes("b") if c[0] > killed_at] == [], "b's leader changed role on b"
    assert any(t < killed_at + took for t in b_received), "b was not dispatched while a had no leader"
    for rid, outcome in outcomes.items():
        if owner[rid] is doomed:
            assert ok(outcome) or code(outcome) == grpc.StatusCode.UNAVAILABLE, f"{rid}: {outcome!r}"
        else:
            assert ok(outcome), f"{rid} at a survivor failed: {outcome!r}"

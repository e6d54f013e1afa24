"""Seeded chaos through a cluster: replicas in one event loop on one in-memory store in front of one simulator,
with clients on every replica and faults drawn from a seed, checking the cluster's promises as a whole.

`run(seed)` starts three replicas (one or two models, so leadership may be split), has clients on every live
replica submit and stream (some cancel, some give up after a deadline), and meanwhile draws faults one after
the other: a replica killed (`kill -9`) or stopped (SIGTERM) and a new one started, the store down for less or
more than the lease's life or restarted empty, one replica cut off from the store (a partition), the store
slow (each call late, some past the store's time limit with or without having taken effect, as a hung Redis
answers), the engine failing requests (refused, an error or a cut after some tokens), a reload of one replica.
Then the faults stop and the clients too.

What it checks (`Verdict.problems` names each broken promise):
- every call ends, within a generous bound, with a definite status: OK with every token asked for, or one
  the fault explains (UNAVAILABLE: its replica died or stopped, or the engine failed it; CANCELLED or
  DEADLINE_EXCEEDED: the client left), never INTERNAL or UNKNOWN; a call at a replica that lived throughout,
  that the client did not leave and no engine fault could touch is OK;
- the engine never holds two requests of one call at once, and runs a call untouched by engine faults at
  most once; nothing is left at the engine once every call ended (no orphan);
- no replica counts an internal error;
- after the faults, the cluster settles to one leader per model that every replica follows and serves a new
  call at every replica, and no replica holds anything of the ended calls (queues, mirrors, engine budget).

The store and the clock are real time (gRPC and the simulator are real sockets), so waits are bounded
generously and end as soon as their condition holds. `python -m tests.cluster.chaos FIRST COUNT [SECONDS]`
hunts over seeds FIRST.. FIRST+COUNT-1 and prints the failures; the suite runs a few fixed seeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import structlog

from backends.sim import SimConfig, running_simulator
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.cluster.store import DuplicateReplica, StoreTimeout, StoreUnavailable
from scheduler_svc.config import ClusterConfig, Config
from tests.cluster.fake_store import FakeStore, FakeStoreBackend
from tests.cluster.replicas import TIMEOUT, agent_of, cluster_config, leaders_settled, stop_all
from tests.helpers import client_for, client_label, eventually

T = TypeVar("T")

OP_LIMIT = 0.1  # the store's time limit per call, as RedisStore.from_config sets it for these heartbeats
CALL_BOUND = 40.0  # a call still open this long after the faults stopped is lost
SIM = SimConfig(max_num_seqs=6, decode_base_ms=3.0, decode_per_seq_ms=0.5)
GATE = {"waiting_target": 2, "fallback_max_in_flight": 6}
USERS = ("ann", "bob", "cat", "dan")


# -- the store, with faults ---------------------------------------------------------------------------------
@dataclass
class StoreFaults:
    """What the store does wrong now, shared by every replica's handle."""

    rng: random.Random
    cut_off: set[str] = field(default_factory=set)  # replicas that cannot reach the store (a partition)
    lag: float = 0.0  # each call takes up to this long
    slow_only: str | None = None  # only this replica's calls are slow (None: every replica's)
    late_lands: float = 0.5  # of the calls past OP_LIMIT, the share that took effect all the same


class FaultyStore(FakeStore):
    """One replica's handle on the shared fake store, through `StoreFaults`: cut off, or slow, and a call slower
    than OP_LIMIT raises StoreTimeout after it, having taken effect or not (a write that reached Redis whose
    answer came too late). A late inbox read never loses what it would have returned (RedisStore reads from
    its cursor again)."""

    def __init__(self, backend: FakeStoreBackend, faults: StoreFaults, name: str) -> None:
        super().__init__(backend)
        self.faults = faults
        self.name = name

    def _reachable(self) -> None:
        if self.name in self.faults.cut_off:
            raise StoreUnavailable(f"{self.name} is cut off from the store")

    async def _call(self, op: Callable[[], Awaitable[T]], *, reads: bool = False) -> T:
        self._reachable()
        slow = self.faults.lag and self.faults.slow_only in (None, self.name)
        lag = self.faults.rng.uniform(0, self.faults.lag) if slow else 0.0
        if lag <= OP_LIMIT:
            if lag:
                await asyncio.sleep(lag)
            self._reachable()
            return await op()
        await asyncio.sleep(OP_LIMIT)
        if not reads and self.faults.rng.random() < self.faults.late_lands:
            with contextlib.suppress(StoreUnavailable):
                await op()
        raise StoreTimeout(f"store call past {OP_LIMIT}s")

    async def join(self, name: str, token: str, ttl: float) -> None:
        await self._call(lambda: super(FaultyStore, self).join(name, token, ttl))

    async def renew(self, name: str, token: str, ttl: float) -> bool:
        return await self._call(lambda: super(FaultyStore, self).renew(name, token, ttl))

    async def leave(self, name: str, token: str) -> None:
        await self._call(lambda: super(FaultyStore, self).leave(name, token))

    async def members(self) -> list[str]:
        return await self._call(lambda: super(FaultyStore, self).members(), reads=True)

    async def acquire_lease(self, lease: str, holder: str, ttl: float) -> bool:
        return await self._call(lambda: super(FaultyStore, self).acquire_lease(lease, holder, ttl))

    async def renew_lease(self, lease: str, holder: str, ttl: float) -> bool:
        return await self._call(lambda: super(FaultyStore, self).renew_lease(lease, holder, ttl))

    async def release_lease(self, lease: str, holder: str) -> None:
        await self._call(lambda: super(FaultyStore, self).release_lease(lease, holder))

    async def lease_holders(self, leases: Sequence[str]) -> dict[str, str | None]:
        return await self._call(lambda: super(FaultyStore, self).lease_holders(leases), reads=True)

    async def send(self, batches: Mapping[str, Sequence[bytes]]) -> None:
        await self._call(lambda: super(FaultyStore, self).send(batches))

    async def receive(self, me: str, timeout: float) -> list[bytes]:
        self._reachable()
        cursor = self.read_upto.get(me)
        got = await self._call(lambda: super(FaultyStore, self).receive(me, timeout), reads=True)
        if self.name in self.faults.cut_off:  # cut off while blocked: nothing read, the cursor where it was
            if cursor is not None:
                self.read_upto[me] = cursor
            raise StoreUnavailable(f"{self.name} is cut off from the store")
        return got


# -- the calls ------------------------------------------------------------------------------------------------
@dataclass
class Call:
    rid: str
    replica: str
    model: str
    user: str
    stream: bool
    max_tokens: int
    started: float
    leaves_after: float | None = None  # the client cancels after this long (None: it stays)
    deadline: float | None = None
    ended: float | None = None
    status: str | None = None  # "OK" or the gRPC status code's name
    detail: str = ""
    tokens: int = 0


@dataclass
class World:
    seed: int
    seconds: float
    rng: random.Random
    store: FakeStoreBackend
    faults: StoreFaults
    sim_url: str
    models: tuple[str, ...]
    servers: dict[str, SchedulerServer] = field(default_factory=dict)
    alive: dict[str, SchedulerServer] = field(default_factory=dict)  # started and neither killed nor stopped
    gone_at: dict[str, float] = field(default_factory=dict)  # replica -> when it was killed or stopped
    calls: list[Call] = field(default_factory=list)
    engine_faults: list[tuple[float, float]] = field(default_factory=list)  # windows of injected engine faults
    log: list[str] = field(default_factory=list)
    next_replica: int = 0
    label_of: dict[str, str] = field(default_factory=dict)  # replica name -> its current process's label
    stopping: list[asyncio.Task[None]] = field(default_factory=list)

    def note(self, what: str) -> None:
        self.log.append(f"{time.monotonic() - self.t0:7.3f} {what}")

    t0: float = field(default_factory=time.monotonic)

    def config(self, name: str) -> Config:
        return cluster_config(self.sim_url, name, gate=dict(GATE), models=self.models)

    async def start_replica(self, name: str | None = None) -> None:
        if name is None:
            name = f"r{self.next_replica}"
            self.next_replica += 1

        def factory(cluster: ClusterConfig, _registry: object) -> FaultyStore:
            return FaultyStore(self.store, self.faults, cluster.replica_name)

        server = SchedulerServer(self.config(name), store_factory=factory)
        await server.start()
        label = f"{name}#{len(self.servers)}"
        self.servers[label] = server
        self.label_of[name] = label
        self.alive[name] = server
        self.note(f"started {name}")


async def _one_call(world: World, server: SchedulerServer, call: Call) -> None:
    prompt = f"{call.rid} " + "words " * world.rng.randint(1, 40)
    kwargs: dict[str, Any] = {"max_tokens": call.max_tokens, "ignore_eos": True, "request_id": call.rid}
    if call.deadline is not None:
        kwargs["timeout"] = call.deadline
    try:
        async with client_for(server, user=call.user) as client:
            if call.stream:
                stream = client.stream(call.model, prompt, **kwargs)
                if call.leaves_after is not None:
                    asyncio.get_running_loop().call_later(call.leaves_after, stream.cancel)
                tokens = 0
                finished = False
                async for event in stream:
                    if event.HasField("finished"):
                        finished = True
                        tokens = event.finished.usage.completion_tokens
                call.status = "OK" if finished else "NO_FINISH"
                call.tokens = tokens
            else:
                submit = asyncio.ensure_future(client.submit(call.model, prompt, **kwargs))
                if call.leaves_after is not None:
                    asyncio.get_running_loop().call_later(call.leaves_after, submit.cancel)
                response = await submit
                call.status = "OK"
                call.tokens = response.usage.completion_tokens
    except grpc.aio.AioRpcError as exc:
        call.status = exc.code().name
        call.detail = exc.details() or ""
    except asyncio.CancelledError:
        call.status = "CANCELLED"
        if call.leaves_after is None:
            raise
    call.ended = time.monotonic()


async def _clients(world: World, until: float, tasks: list[asyncio.Task[None]]) -> None:
    """Calls at random live replicas until `until`."""
    n = 0
    while time.monotonic() < until:
        await asyncio.sleep(world.rng.expovariate(1 / 0.02))
        if not world.alive:
            continue
        name = world.rng.choice(sorted(world.alive))
        server = world.alive[name]
        user = world.rng.choice(USERS)
        call = Call(
            rid=f"s{world.seed}-c{n}",
            replica=world.label_of[name],
            model=world.rng.choice(world.models),
            user=user,
            stream=world.rng.random() < 0.5,
            max_tokens=world.rng.randint(3, 40),
            started=time.monotonic(),
            leaves_after=world.rng.uniform(0.0, 0.5) if world.rng.random() < 0.15 else None,
            deadline=world.rng.uniform(0.2, 3.0) if world.rng.random() < 0.05 else None,
        )
        n += 1
        world.calls.append(call)
        tasks.append(asyncio.create_task(_one_call(world, server, call), name=call.rid))


# -- the faults -----------------------------------------------------------------------------------------------
def _a_leader(world: World) -> str | None:
    leaders = sorted(name for name, server in world.alive.items() if agent_of(server).leading)
    return world.rng.choice(leaders) if leaders else None


async def _kill(world: World, graceful: bool, leader: bool) -> None:
    if len(world.alive) < 2:
        return
    name = (_a_leader(world) if leader else None) or world.rng.choice(sorted(world.alive))
    server = world.alive.pop(name)
    world.gone_at[world.label_of[name]] = time.monotonic()
    if graceful:
        world.note(f"SIGTERM {name}")
        stopping = asyncio.create_task(server.stop(grace=world.rng.choice([0.0, 0.3, 1.0])))
    else:
        world.note(f"kill {name}")
        await agent_of(server).kill()
        stopping = asyncio.create_task(server.stop(grace=0.0))
    world.stopping.append(stopping)
    if world.rng.random() < 0.3:  # the same name again once the old one expired (a restarted pod)
        await stopping
        for _ in range(20):
            await asyncio.sleep(TIMEOUT * 1.5)
            with contextlib.suppress(DuplicateReplica):  # the old process's name is not expired yet
                await world.start_replica(name)
                break
    else:
        await asyncio.sleep(world.rng.uniform(0.0, 0.6))
        await world.start_replica()


async def _store_down(world: World) -> None:
    seconds = world.rng.choice([world.rng.uniform(0.05, TIMEOUT * 0.8), world.rng.uniform(TIMEOUT * 1.2, 1.5)])
    empty = world.rng.random() < 0.3
    world.note(f"store down {seconds:.2f}s{' then empty' if empty else ''}")
    world.store.down()
    await asyncio.sleep(seconds)
    if empty:
        world.store.restart_empty()
    else:
        world.store.up = True


async def _partition(world: World) -> None:
    name = world.rng.choice(sorted(world.alive))
    seconds = world.rng.choice([world.rng.uniform(0.05, TIMEOUT * 0.8), world.rng.uniform(TIMEOUT * 1.2, 1.5)])
    world.note(f"partition {name} {seconds:.2f}s")
    world.faults.cut_off.add(name)
    world.store.arrived.setdefault(name, asyncio.Event()).set()  # its blocked read notices
    await asyncio.sleep(seconds)
    world.faults.cut_off.discard(name)


async def _slow(world: World) -> None:
    lag = world.rng.choice([0.03, 0.08, 0.15, 0.3])
    seconds = world.rng.uniform(0.3, 1.5)
    world.faults.slow_only = world.rng.choice([None, *sorted(world.alive)])
    world.note(f"store slow up to {lag:.2f}s for {seconds:.2f}s for {world.faults.slow_only or 'everyone'}")
    world.faults.lag = lag
    await asyncio.sleep(seconds)
    world.faults.lag = 0.0


async def _engine_faults(world: World, sim: Any) -> None:
    fault = world.rng.choice(
        [
            {"reject_all_with_status": 503},
            {"stream_error_after_tokens": world.rng.randint(0, 3)},
            {"stream_cut_after_tokens": world.rng.randint(0, 3)},
        ]
    )
    seconds = world.rng.uniform(0.05, 0.4)
    world.note(f"engine {fault} for {seconds:.2f}s")
    start = time.monotonic()
    sim.faults.update(fault)
    await asyncio.sleep(seconds)
    sim.faults.clear()
    world.engine_faults.append((start, time.monotonic()))


async def _reload(world: World) -> None:
    name = world.rng.choice(sorted(world.alive))
    gate = dict(GATE, waiting_target=world.rng.randint(1, 4))
    world.note(f"reload {name} {gate}")
    world.alive[name].scheduler.reconfigure(cluster_config(world.sim_url, name, gate=gate, models=world.models))


FAULTS = ("kill", "kill_leader", "sigterm", "sigterm_leader", "store_down", "partition", "slow", "engine", "reload")


async def _faults(world: World, sim: Any, until: float, kinds: Sequence[str]) -> None:
    while time.monotonic() < until:
        await asyncio.sleep(world.rng.uniform(0.1, 0.6))
        kind = world.rng.choice(kinds)
        if kind.startswith(("kill", "sigterm")):
            await _kill(world, graceful=kind.startswith("sigterm"), leader=kind.endswith("leader"))
        elif kind == "store_down":
            await _store_down(world)
        elif kind == "partition":
            await _partition(world)
        elif kind == "slow":
            await _slow(world)
        elif kind == "engine":
            await _engine_faults(world, sim)
        elif kind == "reload":
            await _reload(world)


# -- the checks -----------------------------------------------------------------------------------------------
def _internal_errors(server: SchedulerServer) -> float:
    return sum(
        sample.value
        for metric in server.scheduler.metrics.registry.collect()
        for sample in metric.samples
        if sample.name == "llmsched_internal_errors_total"
    )


def _journal(path: Path) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """(engine request id, the engine's arrival number) -> its journal lines: one request reaching the engine
    (the same id arrives again only when a connection broke before any answer, `HttpEngine.post_stream`)."""
    out: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if "id" in entry and "seq" in entry:
            out[(str(entry["id"]), int(entry["seq"]))].append(entry)
    return out


def _engine_problems(world: World, journal: Mapping[tuple[str, int], list[dict[str, Any]]]) -> list[str]:
    problems = []
    spans: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for (engine_id, _), lines in journal.items():
        ends = [entry for entry in lines if entry["event"] in ("finished", "aborted", "failed")]
        if not ends:
            problems.append(f"engine id {engine_id} never ended at the engine (orphan)")
            continue
        spans[client_label(engine_id)].append((lines[0]["t"], ends[0]["t"], engine_id))
    by_rid = {call.rid: call for call in world.calls}
    for label, runs in spans.items():
        runs.sort()
        for (_, end, first), (start, _, second) in itertools.pairwise(runs):
            if start < end:
                problems.append(f"{label}: {first} and {second} at the engine at once")
        call = by_rid.get(label)
        if call is not None and len(runs) > 1 and not _touched_by_engine_faults(world, call):
            problems.append(f"{label}: ran {len(runs)} times at the engine with no engine fault: {runs}")
    return problems


def _touched_by_engine_faults(world: World, call: Call) -> bool:
    end = call.ended if call.ended is not None else float("inf")
    return any(start <= end and call.started <= stop for start, stop in world.engine_faults)


EXPLAINED_BY_DEATH = {"UNAVAILABLE", "CANCELLED"}
EXPLAINED_BY_ENGINE = {"UNAVAILABLE", "INTERNAL_BACKEND", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED", "ABORTED"}


def _call_problems(world: World, journal_labels: Counter[str]) -> list[str]:
    problems = []
    for call in world.calls:
        if call.ended is None:
            problems.append(f"{call.rid} at {call.replica} never ended")
            continue
        if call.status in ("INTERNAL", "UNKNOWN", "NO_FINISH"):
            problems.append(f"{call.rid} at {call.replica}: {call.status} {call.detail}")
            continue
        if call.status == "OK":
            if call.tokens != call.max_tokens and not _touched_by_engine_faults(world, call):
                problems.append(f"{call.rid}: OK with {call.tokens} of {call.max_tokens} tokens")
            if journal_labels[call.rid] == 0:
                problems.append(f"{call.rid}: OK without reaching the engine")
            continue
        left = call.leaves_after is not None or call.deadline is not None
        died = call.replica in world.gone_at and world.gone_at[call.replica] <= call.ended
        if left and call.status in ("CANCELLED", "DEADLINE_EXCEEDED"):
            continue
        if died and call.status in EXPLAINED_BY_DEATH:
            continue
        if _touched_by_engine_faults(world, call):
            continue
        problems.append(f"{call.rid} at {call.replica} ({call.model}, {call.user}): {call.status} {call.detail}")
    return problems


async def _settle_problems(world: World) -> list[str]:
    servers = list(world.alive.values())
    try:
        await leaders_settled(servers, world.models, timeout=15.0)
    except TimeoutError:
        roles = {
            name: {m: (agent_of(s).role_of(m).value, agent_of(s).leader_of(m)) for m in world.models}
            for name, s in world.alive.items()
        }
        return [f"no settled leadership after the faults: {roles}"]
    problems = []
    for name, server in world.alive.items():
        async with client_for(server, user="probe") as client:
            for model in world.models:
                try:
                    response = await asyncio.wait_for(
                        client.submit(model, "probe", max_tokens=2, ignore_eos=True), CALL_BOUND
                    )
                    if response.usage.completion_tokens != 2:
                        problems.append(f"probe at {name} for {model}: {response.usage.completion_tokens} tokens")
                except (grpc.aio.AioRpcError, TimeoutError) as exc:
                    problems.append(f"probe at {name} for {model} failed: {exc!r}")

    def empty() -> bool:
        for server in world.alive.values():
            agent = agent_of(server)
            if agent.leader.mirrors:
                return False
            for dispatcher in server.scheduler.dispatchers.values():
                if dispatcher.cluster.live_tickets():
                    return False
                if any(handle.estimator.in_flight for handle in dispatcher.backends):
                    return False
        return True

    try:
        await eventually(empty, 10.0, "nothing held")
    except TimeoutError:
        for name, server in world.alive.items():
            agent = agent_of(server)
            held = {
                "mirrors": sorted(agent.leader.mirrors),
                "live": {
                    m: [t.request.request_id for t in d.cluster.live_tickets()]
                    for m, d in server.scheduler.dispatchers.items()
                },
                "in_flight": {
                    m: [h.estimator.in_flight for h in d.backends] for m, d in server.scheduler.dispatchers.items()
                },
            }
            problems.append(f"{name} still holds {held}")
    return problems


# -- one run --------------------------------------------------------------------------------------------------
@dataclass
class Verdict:
    seed: int
    problems: list[str]
    log: list[str]
    calls: int
    outcomes: Counter[str]


async def run(seed: int, seconds: float = 4.0, kinds: Sequence[str] = FAULTS) -> Verdict:
    """One seeded run (see the module docstring); `seconds` of traffic and faults."""
    rng = random.Random(seed)
    models = rng.choice([("m",), ("a", "b")])
    with tempfile.TemporaryDirectory() as tmp:
        journal_path = Path(tmp) / "journal.jsonl"
        sim_config = dataclasses.replace(SIM, journal=str(journal_path))
        async with running_simulator(sim_config) as sim:
            faults = StoreFaults(random.Random(rng.random()))
            world = World(seed, seconds, rng, FakeStoreBackend(), faults, sim.url, models)
            problems: list[str] = []
            tasks: list[asyncio.Task[None]] = []
            try:
                for _ in range(3):
                    await world.start_replica()
                await leaders_settled(list(world.alive.values()), models)
                until = time.monotonic() + seconds
                overlapping = rng.choice([1, 2, 2, 3])  # fault drivers at once: their faults overlap
                await asyncio.gather(
                    _clients(world, until, tasks), *(_faults(world, sim, until, kinds) for _ in range(overlapping))
                )
                world.faults.cut_off.clear()
                world.faults.lag = 0.0
                world.store.up = True
                sim.faults.clear()
                world.note("faults over")
                if tasks:
                    _, pending = await asyncio.wait(tasks, timeout=CALL_BOUND)
                    for task in pending:
                        task.cancel()
                await asyncio.gather(*world.stopping, return_exceptions=True)
                problems += await _settle_problems(world)
                await eventually(lambda: sim.engine.num_running + sim.engine.num_waiting == 0, 10.0, "engine idle")
            except Exception as exc:
                problems.append(f"harness: {exc!r}\n{traceback.format_exc()}")
            finally:
                await stop_all(world.alive.values())
            journal = _journal(journal_path)
            if keep := os.environ.get("CHAOS_KEEP"):
                shutil.copy(journal_path, Path(keep) / f"journal-{seed}.jsonl")
            labels = Counter(client_label(engine_id) for engine_id, _ in journal)
            problems += _engine_problems(world, journal)
            problems += _call_problems(world, labels)
            for name, server in world.servers.items():
                if errors := _internal_errors(server):
                    problems.append(f"{name} counted {errors:g} internal errors")
    outcomes = Counter(call.status or "open" for call in world.calls)
    return Verdict(seed, problems, world.log, len(world.calls), outcomes)


def quiet() -> None:
    """Only warnings and errors from the service's logs."""
    logging.basicConfig(level=logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))


async def _hunt(first: int, count: int, seconds: float) -> int:
    failed = 0
    for seed in range(first, first + count):
        started = time.monotonic()
        verdict = await run(seed, seconds)
        took = time.monotonic() - started
        print(f"seed {seed}: {verdict.calls} calls {dict(verdict.outcomes)} {took:.1f}s", flush=True)
        if verdict.problems:
            failed += 1
            print("\n".join(["  FAULTS:", *("    " + line for line in verdict.log), "  PROBLEMS:"]))
            print("\n".join("    " + p for p in verdict.problems[:20]), flush=True)
    return failed


if __name__ == "__main__":
    quiet()
    first, count = int(sys.argv[1]), int(sys.argv[2])
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 4.0
    sys.exit(1 if asyncio.run(_hunt(first, count, seconds)) else 0)

"""One conformance suite for every `ClusterStore`: the in-memory fake (unit tests rely on it behaving like
Redis) and `RedisStore` on a real redis-server (its own port and data directory).

Each test gets a `Harness`: `store()` makes a replica's handle, `advance(s)` lets `s` seconds pass (the
fake's clock moves; with Redis real time passes: expiry is Redis's own), `down()` / `restart_empty()`
break the store, `round_trips(handle)` counts the calls to the store.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

from scheduler_svc.cluster.redis_store import RedisStore
from scheduler_svc.cluster.store import ClusterStore, DuplicateReplica, StoreUnavailable
from scheduler_svc.config import ClusterConfig, ConfigError
from tests.cluster.fake_store import FakeStore, FakeStoreBackend
from tests.cluster.redis_server import RedisServer

TTL = 0.3  # short-lived names and leases: expiry tests wait about this long
LONG = 30.0  # long enough never to expire during a test
OP_TIMEOUT = 0.3  # RedisStore's per-call bound in these tests
SMALL_INBOX = 10


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    kind: str
    make: Callable[[int], ClusterStore]
    advance: Callable[[float], Awaitable[None]]
    down: Callable[[], None]
    restart_empty: Callable[[], None]
    round_trips: Callable[[ClusterStore], int]
    server: RedisServer | None = None
    stack: AsyncExitStack = field(default_factory=AsyncExitStack)

    async def store(self, inbox_limit: int = 10_000) -> ClusterStore:
        handle = self.make(inbox_limit)
        self.stack.push_async_callback(handle.aclose)
        return handle


class _SocketWrites:
    """Counts every command write to a Redis socket in this test: one per round trip (a pipeline is written at
    once). Only one handle works while a test measures, so the count is that handle's."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = AbstractConnection.send_packed_command

        async def counting(conn: AbstractConnection, command: Any, check_health: bool = True) -> None:
            self.count += 1
            await original(conn, command, check_health)

        monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)

    def of(self, store: ClusterStore) -> int:
        return self.count


@pytest.fixture(params=["fake", "redis"])
async def harness(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    if request.param == "fake":
        clock = ManualClock()
        backend = FakeStoreBackend(clock=clock)

        def make_fake(limit: int) -> ClusterStore:
            backend.inbox_limit = limit
            return FakeStore(backend)

        async def advance_fake(seconds: float) -> None:
            clock.now += seconds

        def fake_ops(store: ClusterStore) -> int:
            assert isinstance(store, FakeStore)
            return store.ops

        h = Harness("fake", make_fake, advance_fake, backend.down, backend.restart_empty, fake_ops)
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        trips = _SocketWrites(monkeypatch)

        def make_redis(limit: int) -> ClusterStore:
            return RedisStore(server.url, key_prefix="t", op_timeout=OP_TIMEOUT, inbox_limit=limit)

        async def advance_real(seconds: float) -> None:
            await asyncio.sleep(seconds)

        h = Harness("redis", make_redis, advance_real, server.kill, server.restart_empty, trips.of, server)
    async with h.stack:
        yield h


async def retried(call: Callable[[], Awaitable[Any]], seconds: float = 5.0) -> Any:
    """The first answer `call` gives without StoreUnavailable (a restarted store may refuse one call while
    connections are replaced), within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return await call()
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def receive_until(store: ClusterStore, me: str, count: int, seconds: float = 5.0) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + seconds
    while len(got) < count and time.monotonic() < deadline:
        got += await retried(lambda: store.receive(me, 0.2))
    return got


# --- membership ---


async def test_join_refuses_a_live_name_held_by_another_token(harness: Harness) -> None:
    a, b = await harness.store(), await harness.store()
    await a.join("r1", "token-a", LONG)
    with pytest.raises(DuplicateReplica):
        await b.join("r1", "token-b", LONG)
    await a.join("r1", "token-a", LONG)  # joining again with our own token is fine
    assert await b.members() == ["r1"]


async def test_members_are_the_live_names_sorted(harness: Harness) -> None:
    a = await harness.store()
    for name in ("r3", "r1", "r2"):
        await a.join(name, "t-" + name, LONG)
    await a.join("short", "t", TTL)
    assert await a.members() == ["r1", "r2", "r3", "short"]
    await harness.advance(TTL * 2)
    assert await a.members() == ["r1", "r2", "r3"]


async def test_renew_extends_only_our_own_claim(harness: Harness) -> None:
    ttl = 1.5  # long enough that a loaded machine's late wake-ups (< 0.4 ttl) do not outlive it
    a = await harness.store()
    await a.join("r1", "mine", ttl)
    assert not await a.renew("r1", "not-mine", ttl)
    await harness.advance(0.6 * ttl)
    assert await a.renew("r1", "mine", ttl)
    await harness.advance(0.6 * ttl)  # 1.2 ttl after the join: alive only because it was renewed
    assert await a.members() == ["r1"]


async def test_an_expired_name_is_gone_and_free(harness: Harness) -> None:
    a, b = await harness.store(), await harness.store()
    await a.join("r1", "old", TTL)
    await harness.advance(TTL * 2)
    assert await a.members() == []
    assert not await a.renew("r1", "old", TTL)
    await b.join("r1", "new", LONG)
    assert await a.members() == ["r1"]
    assert not await a.renew("r1", "old", TTL)


async def test_leave_frees_only_our_own_name(harness: Harness) -> None:
    a, b = await harness.store(), await harness.store()
    await a.join("r1", "mine", LONG)
    await b.leave("r1", "other")
    assert await a.members() == ["r1"]
    await a.leave("r1", "mine")
    assert await a.members() == []
    await b.join("r1", "other", LONG)
    assert await a.members() == ["r1"]


# --- the leader leases ---


async def test_one_lease_holder_at_a_time(harness: Harness) -> None:
    a, b = await harness.store(), await harness.store()
    assert await a.lease_holders(["m"]) == {"m": None}
    assert await a.acquire_lease("m", "r1/a", LONG)
    assert not await b.acquire_lease("m", "r2/b", LONG)
    assert await a.acquire_lease("m", "r1/a", LONG)  # already ours
    assert await b.lease_holders(["m"]) == {"m": "r1/a"}
    assert await a.renew_lease("m", "r1/a", LONG)
    assert not await b.renew_lease("m", "r2/b", LONG)
    await b.release_lease("m", "r2/b")  # not held by b: nothing happens
    assert await a.lease_holders(["m"]) == {"m": "r1/a"}
    await a.release_lease("m", "r1/a")
    assert await a.lease_holders(["m"]) == {"m": None}
    assert await b.acquire_lease("m", "r2/b", LONG)
    assert await a.lease_holders(["m"]) == {"m": "r2/b"}


async def test_each_lease_is_separate(harness: Harness) -> None:
    """One replica may hold one model's lease and another the next one's; taking, renewing or releasing one
    never touches another, and the lease covering every model ("") is one more of them."""
    a, b = await harness.store(), await harness.store()
    assert await a.acquire_lease("m1", "r1/a", LONG)
    assert await b.acquire_lease("m2", "r2/b", LONG)
    assert not await a.acquire_lease("m2", "r1/a", LONG)
    assert not await b.renew_lease("m1", "r2/b", LONG)
    await b.release_lease("m1", "r2/b")
    assert await a.lease_holders(["m1", "m2", ""]) == {"m1": "r1/a", "m2": "r2/b", "": None}
    assert await b.acquire_lease("", "r2/b", LONG)
    await a.release_lease("m1", "r1/a")
    assert await b.lease_holders(["m1", "m2", ""]) == {"m1": None, "m2": "r2/b", "": "r2/b"}


async def test_the_holders_of_many_leases_are_one_round_trip(harness: Harness) -> None:
    a = await harness.store()
    assert await a.acquire_lease("m3", "r1/a", LONG)  # connections made
    names = [f"m{i}" for i in range(20)]
    before = harness.round_trips(a)
    holders = await a.lease_holders(names)
    assert harness.round_trips(a) - before == 1
    assert holders == {name: "r1/a" if name == "m3" else None for name in names}


async def test_an_unrenewed_lease_expires_and_a_renewed_one_does_not(harness: Harness) -> None:
    ttl = 1.5
    a, b = await harness.store(), await harness.store()
    assert await a.acquire_lease("m", "r1/a", ttl)
    await harness.advance(0.6 * ttl)
    assert await a.renew_lease("m", "r1/a", ttl)
    await harness.advance(0.6 * ttl)  # 1.2 ttl after taking it: held only because it was renewed
    assert await b.lease_holders(["m"]) == {"m": "r1/a"}
    await harness.advance(0.5 * ttl)  # 1.1 ttl after the renewal
    assert await b.lease_holders(["m"]) == {"m": None}
    assert not await a.renew_lease("m", "r1/a", ttl)
    assert await b.acquire_lease("m", "r2/b", ttl)


# --- inboxes ---


async def test_inbox_delivers_in_order_once(harness: Harness) -> None:
    a, b = await harness.store(), await harness.store()
    await b.join("r2", "t", LONG)
    await a.send({"r2": [b"1", b"2"]})
    await a.send({"r2": [b"3"]})
    assert await receive_until(b, "r2", 3) == [b"1", b"2", b"3"]
    assert await b.receive("r2", 0.05) == []
    await a.send({"r2": [b"4"]})
    assert await b.receive("r2", 1.0) == [b"4"]


async def test_send_of_several_messages_is_one_round_trip(harness: Harness) -> None:
    a, b = await harness.store(), await harness.store()
    await b.join("r2", "t", LONG)
    await a.send({"r2": [b"warm-up"]})  # connections made
    before = harness.round_trips(a)
    await a.send({"r2": [str(i).encode() for i in range(50)]})
    assert harness.round_trips(a) - before == 1
    assert await receive_until(b, "r2", 51) == [b"warm-up", *(str(i).encode() for i in range(50))]


async def test_messages_to_several_replicas_are_one_round_trip(harness: Harness) -> None:
    a, b, c = await harness.store(), await harness.store(), await harness.store()
    await b.join("r2", "t", LONG)
    await c.join("r3", "t", LONG)
    await a.send({"r2": [b"warm-up"]})  # connections made
    before = harness.round_trips(a)
    await a.send({"r2": [b"2a", b"2b"], "r3": [b"3a"], "r4": []})
    assert harness.round_trips(a) - before == 1
    assert await receive_until(b, "r2", 3) == [b"warm-up", b"2a", b"2b"]
    assert await receive_until(c, "r3", 1) == [b"3a"]


async def test_blocking_receive_wakes_on_send(harness: Harness) -> None:
    a, b = await harness.store(), await harness.store()
    await b.join("r2", "t", LONG)
    waiting = asyncio.create_task(b.receive("r2", 30.0))
    await asyncio.sleep(0.05)  # let it block (if it has not, it simply reads the message at once)
    assert not waiting.done()
    await a.send({"r2": [b"wake"]})
    assert await asyncio.wait_for(waiting, 10.0) == [b"wake"]


async def test_receive_times_out_with_nothing(harness: Harness) -> None:
    b = await harness.store()
    await b.join("r2", "t", LONG)
    started = time.monotonic()
    assert await b.receive("r2", 0.2) == []
    assert time.monotonic() - started >= 0.15


async def test_an_inbox_is_bounded_dropping_the_oldest(harness: Harness) -> None:
    a, b = await harness.store(SMALL_INBOX), await harness.store(SMALL_INBOX)
    await b.join("r2", "t", LONG)
    sent = [str(i).encode() for i in range(1000)]
    for start in range(0, len(sent), 100):
        await a.send({"r2": sent[start : start + 100]})
    got = await b.receive("r2", 1.0)
    # Redis trims whole stream nodes (MAXLEN ~), keeping up to one node (100 entries) beyond the bound
    assert SMALL_INBOX <= len(got) <= SMALL_INBOX + 100
    assert got == sent[-len(got) :]


async def test_a_new_process_does_not_read_what_an_earlier_one_of_its_name_was_sent(harness: Harness) -> None:
    sender, old = await harness.store(), await harness.store()
    await old.join("r2", "old", TTL)
    await sender.send({"r2": [b"for the old process"]})
    await harness.advance(TTL * 2)  # the old process died without reading
    new = await harness.store()
    await new.join("r2", "new", LONG)
    await sender.send({"r2": [b"for the new one"]})
    assert await new.receive("r2", 1.0) == [b"for the new one"]


async def test_messages_sent_between_join_and_first_receive_arrive(harness: Harness) -> None:
    a, b = await harness.store(), await harness.store()
    await b.join("r2", "t", LONG)
    await a.send({"r2": [b"early"]})
    assert await b.receive("r2", 1.0) == [b"early"]


# --- the store failing ---


async def test_every_call_raises_store_unavailable_when_the_store_is_down(harness: Harness) -> None:
    a = await harness.store()
    await a.join("r1", "t", LONG)
    waiting = asyncio.create_task(a.receive("r1", 30.0))
    await asyncio.sleep(0.05)
    harness.down()
    with pytest.raises(StoreUnavailable):
        await asyncio.wait_for(waiting, 5.0)  # a blocked read notices at once, not after its 30 s
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: a.join("r1", "t", LONG),
        lambda: a.renew("r1", "t", LONG),
        lambda: a.leave("r1", "t"),
        a.members,
        lambda: a.acquire_lease("m", "h", LONG),
        lambda: a.renew_lease("m", "h", LONG),
        lambda: a.release_lease("m", "h"),
        lambda: a.lease_holders(["m"]),
        lambda: a.send({"r1": [b"x"]}),
        lambda: a.receive("r1", 0.1),
    ]
    for call in calls:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(call(), 5.0)
        assert time.monotonic() - started < 2.0


async def test_after_a_restart_empty_names_and_lease_are_gone_and_inboxes_go_on(harness: Harness) -> None:
    a, b = await harness.store(), await harness.store()
    await a.join("r1", "ta", LONG)
    await b.join("r2", "tb", LONG)
    assert await a.acquire_lease("m", "r1/ta", LONG)
    await a.send({"r2": [b"before"]})
    assert await b.receive("r2", 1.0) == [b"before"]
    harness.restart_empty()
    assert not await retried(lambda: a.renew("r1", "ta", LONG))
    assert await retried(lambda: a.lease_holders(["m"])) == {"m": None}
    assert not await retried(lambda: a.renew_lease("m", "r1/ta", LONG))
    assert await retried(a.members) == []
    await a.join("r1", "ta", LONG)
    await retried(lambda: a.send({"r2": [b"after-1", b"after-2"]}))
    assert await receive_until(b, "r2", 2) == [b"after-1", b"after-2"]
    await a.send({"r2": [b"after-3"]})
    assert await b.receive("r2", 1.0) == [b"after-3"]


async def test_a_read_blocked_across_a_restart_empty_goes_on_with_new_messages(harness: Harness) -> None:
    a, b = await harness.store(), await harness.store()
    await b.join("r2", "tb", LONG)
    await a.send({"r2": [b"before"]})
    assert await b.receive("r2", 1.0) == [b"before"]
    waiting = asyncio.create_task(b.receive("r2", 30.0))
    await asyncio.sleep(0.05)
    harness.restart_empty()
    with pytest.raises(StoreUnavailable):
        await asyncio.wait_for(waiting, 5.0)
    await retried(lambda: a.send({"r2": [b"after"]}))
    assert await receive_until(b, "r2", 1) == [b"after"]


# --- Redis only: a hung server, stream ids starting over, configuration ---


@pytest.fixture
async def redis_store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    store = RedisStore(redis_server.url, key_prefix="t", op_timeout=OP_TIMEOUT)
    yield store
    await store.aclose()


async def test_a_hung_redis_is_noticed_within_the_op_timeout(
    redis_server: RedisServer, redis_store: RedisStore
) -> None:
    await redis_store.join("r1", "t", LONG)
    waiting = asyncio.create_task(redis_store.receive("r1", 0.5))
    await asyncio.sleep(0.05)
    redis_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await redis_store.renew("r1", "t", LONG)
        assert time.monotonic() - started < OP_TIMEOUT + 0.5
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(waiting, 5.0)  # its own bound: the block (0.5 s) + the op timeout
    finally:
        redis_server.resume()
    assert await retried(lambda: redis_store.renew("r1", "t", LONG))


async def test_an_inbox_whose_ids_start_over_is_read_from_its_start(
    redis_server: RedisServer, redis_store: RedisStore
) -> None:
    """A store restarted empty on a server whose clock went back: new ids are below the last one read."""
    await redis_store.join("r2", "t", LONG)
    await redis_store.send({"r2": [b"before"]})
    assert await redis_store.receive("r2", 1.0) == [b"before"]
    redis_server.restart_empty()
    raw = Redis.from_url(redis_server.url)
    try:
        await raw.xadd("t:inbox:r2", {b"m": b"after"}, id="1-1")
    finally:
        await raw.aclose()
    assert await receive_until(redis_store, "r2", 1) == [b"after"]


def test_from_config_reads_the_password_from_a_file_or_the_environment(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "redis-password"
    secret.write_text("s3cret\nignored\n")
    store = RedisStore.from_config(
        ClusterConfig(store="redis", redis_url="redis://127.0.0.1:1/0", redis_password_file=str(secret), key_prefix="p")
    )
    kwargs = store._redis.connection_pool.connection_kwargs
    assert kwargs["password"] == "s3cret" and kwargs["socket_timeout"] == 0.5 and store._prefix == "p"
    monkeypatch.setenv("LLMSCHED_TEST_REDIS_PASSWORD", "from-env")
    store = RedisStore.from_config(
        ClusterConfig(redis_password_env="LLMSCHED_TEST_REDIS_PASSWORD", redis_username="svc")
    )
    kwargs = store._reader.connection_pool.connection_kwargs
    assert kwargs["password"] == "from-env" and kwargs["username"] == "svc"
    with pytest.raises(ConfigError, match="not set"):
        RedisStore.from_config(ClusterConfig(redis_password_env="LLMSCHED_TEST_UNSET_VARIABLE"))
    with pytest.raises(ConfigError, match="cannot read"):
        RedisStore.from_config(ClusterConfig(redis_password_file=str(tmp_path / "missing")))


async def test_a_password_protected_redis(redis_server: RedisServer, tmp_path: Any) -> None:
    raw = Redis.from_url(redis_server.url)
    try:
        await raw.config_set("requirepass", "pw")
    finally:
        await raw.aclose()
    secret = tmp_path / "pw"
    secret.write_text("pw\n")
    store = RedisStore.from_config(ClusterConfig(redis_url=redis_server.url, redis_password_file=str(secret)))
    try:
        await store.join("r1", "t", LONG)
        assert await store.members() == ["r1"]
    finally:
        await store.aclose()


async def test_round_trips_and_unreachable_calls_are_measured(redis_server: RedisServer) -> None:
    registry = CollectorRegistry()
    store = RedisStore(redis_server.url, key_prefix="t", op_timeout=OP_TIMEOUT, registry=registry)
    try:
        await store.join("r1", "t", LONG)
        await store.send({"r1": [b"x"]})
        assert await store.receive("r1", 1.0) == [b"x"]
        redis_server.kill()
        with pytest.raises(StoreUnavailable):
            await store.renew("r1", "t", LONG)
    finally:
        await store.aclose()
    for call in ("join", "send"):
        assert registry.get_sample_value("llmsched_cluster_store_seconds_count", {"call": call}) == 1
    assert registry.get_sample_value("llmsched_cluster_store_seconds_count", {"call": "receive"}) is None
    assert registry.get_sample_value("llmsched_cluster_store_unavailable_total", {"call": "renew"}) == 1

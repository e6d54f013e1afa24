"""`ClusterStore` on Redis (`redis.asyncio`): membership and the leader lease as keys with a TTL changed only
by their owner (Lua compare-and-set scripts), inboxes as Redis Streams.

Keys, all under `key_prefix` (several clusters can share one Redis):
- `{prefix}:member:{name}` = the joining process's token, PX ttl; `{prefix}:members` a sorted set of names
  scored by their expiry (Redis server time, ms), kept beside the keys by the same scripts. `members` reads
  the sorted set (after dropping expired scores) instead of SCANning the keyspace: one round trip, O(log N +
  members), whatever else lives in that Redis, where SCAN walks every key of the database in many round trips
  and KEYS blocks the server.
- `{prefix}:leader:{model}` = the holder string of that model's lease, PX ttl (`{prefix}:leader` for the one
  lease covering every model).
- `{prefix}:inbox:{name}` a stream of entries `{m: data}` (each one batch of messages: `messages.encode_batch`),
  trimmed by `XADD MAXLEN ~ inbox_limit` and
  expiring `INBOX_IDLE_SECONDS` after the last send (an inbox whose replica is gone goes away by itself).

Redis operations per call (each call is ONE round trip, bounded by `op_timeout`):
- `join`: EVALSHA (GET, SET PX, TIME, ZADD, XREVRANGE COUNT 1); `renew`: EVALSHA (GET, PEXPIRE, TIME, ZADD);
  `leave`: EVALSHA (GET, DEL, ZREM); `members`: EVALSHA (TIME, ZREMRANGEBYSCORE, ZRANGE).
- `acquire_lease`: EVALSHA (GET, SET PX when free); `renew_lease`: EVALSHA (GET, PEXPIRE);
  `release_lease`: EVALSHA (GET, DEL); `lease_holders`: one MGET of every lease asked.
- `send({to: k entries, ...})`: one pipeline of k `XADD MAXLEN ~` + one EXPIRE per destination (the outbox
  sends one entry per destination and wake-up, however many messages it holds, every destination at once).
- `receive`: one `XREAD COUNT read_batch BLOCK timeout` on the store's own connection (blocking reads never
  hold up the others); after that connection (re)connects, one `XREVRANGE COUNT 1` first (see below).
A script the server does not know (first use, or after a restart) costs one SCRIPT LOAD more, once.

Where `receive` starts, and a store restarted empty: the first `join` of a name by this store instance sets
that inbox's cursor to the inbox's newest entry, so a new process never reads what was sent to an earlier
process of the same name (a stale Grant could otherwise start a request nobody granted). After the reading
connection reconnects, the cursor is checked against the stream: a stream that is gone, or whose newest id
is older than the cursor, was lost with the store (stream ids restart from the server's clock), and reading
starts over from its beginning, so later messages are neither lost nor waited for forever.

Failures: every connection error, socket timeout, read-only replica or `op_timeout` overrun raises
`StoreUnavailable`; the timeouts are short (at most one heartbeat interval, see `from_config`) so a dead
or hung Redis is noticed within one heartbeat. Scripts and GET (idempotent) are retried once at once on a
connection error, which is how a pooled connection closed by a restarted server is replaced; XADDs never
(a retry after a lost reply could deliver a message twice), nor blocking reads: the first `send` and
`receive` after a restart may raise StoreUnavailable once.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from scheduler_svc.cluster.store import DuplicateReplica, StoreTimeout, StoreUnavailable
from scheduler_svc.config import ClusterConfig, ConfigError

log = structlog.get_logger(__name__)

INBOX_LIMIT = 10_000  # entries kept per inbox (approximately: MAXLEN ~ trims whole stream nodes)
INBOX_IDLE_SECONDS = 600  # an inbox nobody sent to for this long is deleted (its replica is long gone)
READ_BATCH = 1_000  # entries one receive returns at most; the rest come with the next call
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, OSError)  # OSError covers TimeoutError

# Scripts read the server's clock (TIME) so every replica scores expiries on one clock; replicate_commands
# lets Redis 5/6 replicate a script that writes after TIME (Redis 7 always does, and keeps it as a no-op).
_EXPIRY_MS = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
"""
# KEYS: member key, members zset, inbox; ARGV: name, token, ttl ms. Nil when another token holds the name,
# else the inbox's newest id ('0-0' when empty): where this process starts reading.
_JOIN = (
    """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[2] then return false end
"""
    + _EXPIRY_MS
    + """
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('ZADD', KEYS[2], expiry, ARGV[1])
local newest = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
if newest[1] then return newest[1][1] end
return '0-0'
"""
)
# KEYS: member key, members zset; ARGV: name, token, ttl ms. 1 when renewed, 0 when the name is not ours.
_RENEW = (
    """
if redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
"""
    + _EXPIRY_MS
    + """
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], expiry, ARGV[1])
return 1
"""
)
# KEYS: member key, members zset; ARGV: name, token.
_LEAVE = """
if redis.call('GET', KEYS[1]) == ARGV[2] then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
end
return 0
"""
# KEYS: members zset. The names whose expiry is not past, after forgetting the others.
_MEMBERS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""
# KEYS: lease; ARGV: holder, ttl ms. 1 when the holder holds the lease now (taken, or already its own).
_ACQUIRE = """
local held = redis.call('GET', KEYS[1])
if not held then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if held == ARGV[1] then return 1 end
return 0
"""
# KEYS: key; ARGV: expected value, ttl ms. Compare-and-pexpire.
_RENEW_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
# KEYS: key; ARGV: expected value. Compare-and-delete.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class StoreMetrics:
    """The store's round trips on the service's registry: how long they take, and how often Redis was out of
    reach (the call name is the label: a fixed set)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.seconds = Histogram(
            "llmsched_cluster_store_seconds",
            "Round trips to the cluster store (Redis) by call, blocking inbox reads excepted.",
            ["call"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry,
        )
        self.unavailable = Counter(
            "llmsched_cluster_store_unavailable",
            "Calls to the cluster store (Redis) that could not reach it, by call.",
            ["call"],
            registry=registry,
        )


def inbox_key(key_prefix: str, name: str) -> str:
    """The stream that is replica `name`'s inbox."""
    return f"{key_prefix}:inbox:{name}"


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _stream_id(raw: bytes | str) -> tuple[int, int]:
    ms, _, seq = _text(raw).partition("-")
    return int(ms), int(seq or 0)


class RedisStore:
    """One replica's handle on the shared Redis: a pooled client for scripts and GET, one for XADDs (never
    retried), and one dedicated connection for blocking inbox reads."""

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "llmsched",
        username: str | None = None,
        password: str | None = None,
        op_timeout: float = 0.5,
        inbox_limit: int = INBOX_LIMIT,
        read_batch: int = READ_BATCH,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._prefix = key_prefix
        self._metrics = StoreMetrics(registry) if registry is not None else None
        self._op_timeout = op_timeout
        self._inbox_limit = inbox_limit
        self._read_batch = read_batch
        common: dict[str, Any] = {
            "username": username or None,
            "password": password or None,
            "socket_connect_timeout": op_timeout,
            "client_name": "llmsched",
            "protocol": 2,  # RESP2: every Redis since 5 speaks it, and the stream replies below are parsed in its shape
        }
        # Scripts and GET are idempotent: one immediate retry on a fresh connection when a pooled one turns out
        # closed (a restarted server). XADDs are not: a retry after a lost reply could deliver a message twice.
        once = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
        self._redis: Redis = Redis.from_url(url, socket_timeout=op_timeout, retry=once, **common)
        self._sender: Redis = Redis.from_url(url, socket_timeout=op_timeout, retry=Retry(NoBackoff(), 0), **common)
        # Blocking XREADs wait on their own connection, bounded per call (timeout + op_timeout) instead of by a
        # socket timeout shorter than the block. Each (re)connect makes the next read check its cursor.
        self._reader: Redis = Redis.from_url(
            url,
            socket_timeout=None,
            single_connection_client=True,
            redis_connect_func=self._reader_connected,
            retry=Retry(NoBackoff(), 0),
            **common,
        )
        self._reader_epoch = 0
        self._checked_epoch: dict[str, int] = {}
        self._cursor: dict[str, bytes] = {}
        self._join = self._redis.register_script(_JOIN)
        self._renew = self._redis.register_script(_RENEW)
        self._leave = self._redis.register_script(_LEAVE)
        self._members = self._redis.register_script(_MEMBERS)
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._renew_lease = self._redis.register_script(_RENEW_LEASE)
        self._release = self._redis.register_script(_RELEASE)

    @classmethod
    def from_config(cls, cluster: ClusterConfig, registry: CollectorRegistry | None = None) -> RedisStore:
        """The store `[cluster]` describes: password from redis_password_file (first line) or the variable
        named by redis_password_env; metrics on `registry` when given. Every call is bounded by
        min(heartbeat interval, heartbeat timeout / 4): a dead or hung Redis is noticed within one heartbeat,
        and a leader whose renewals stop getting through knows it by interval + timeout/4 <= 3/4 of its lease
        after the last renewal, before the lease can pass to another replica."""
        password: str | None = None
        if cluster.redis_password_file:
            try:
                lines = Path(cluster.redis_password_file).read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ConfigError(f"cluster.redis_password_file: cannot read it: {exc}") from exc
            password = lines[0] if lines else ""
            if not password:
                raise ConfigError("cluster.redis_password_file: the first line (the password) is empty")
        elif cluster.redis_password_env:
            password = os.environ.get(cluster.redis_password_env)
            if not password:
                raise ConfigError(f"cluster.redis_password_env: variable {cluster.redis_password_env} is not set")
        return cls(
            cluster.redis_url,
            key_prefix=cluster.key_prefix,
            username=cluster.redis_username or None,
            password=password,
            op_timeout=min(cluster.heartbeat_interval_seconds, cluster.heartbeat_timeout_seconds / 4),
            registry=registry,
        )

    def _key(self, *parts: str) -> str:
        return ":".join((self._prefix, *parts))

    async def _reader_connected(self, connection: AbstractConnection) -> None:
        await connection.on_connect()
        self._reader_epoch += 1

    @asynccontextmanager
    async def _reach(self, call: str, seconds: float) -> AsyncIterator[None]:
        """Bound one round trip, time it, and turn every way of not reaching Redis into StoreUnavailable."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(seconds):
                yield
        except _UNREACHABLE as exc:
            if self._metrics is not None:
                self._metrics.unavailable.labels(call).inc()
            error = StoreTimeout if isinstance(exc, (TimeoutError, RedisTimeoutError)) else StoreUnavailable
            raise error(f"redis unreachable ({call}): {type(exc).__name__}: {exc}") from exc
        if self._metrics is not None and call != "receive":  # a receive's time is mostly its wait
            self._metrics.seconds.labels(call).observe(time.perf_counter() - started)

    async def join(self, name: str, token: str, ttl: float) -> None:
        member = self._key("member", name)
        async with self._reach("join", self._op_timeout):
            newest = await self._join(
                keys=[member, self._key("members"), inbox_key(self._prefix, name)], args=[name, token, _ms(ttl)]
            )
        if newest is None:
            raise DuplicateReplica(f"replica name {name} is held by another live replica")
        self._cursor.setdefault(name, _text(newest).encode())

    async def renew(self, name: str, token: str, ttl: float) -> bool:
        async with self._reach("renew", self._op_timeout):
            renewed = await self._renew(
                keys=[self._key("member", name), self._key("members")], args=[name, token, _ms(ttl)]
            )
        return bool(renewed)

    async def leave(self, name: str, token: str) -> None:
        async with self._reach("leave", self._op_timeout):
            await self._leave(keys=[self._key("member", name), self._key("members")], args=[name, token])

    async def members(self) -> list[str]:
        async with self._reach("members", self._op_timeout):
            names = await self._members(keys=[self._key("members")])
        return sorted(_text(n) for n in names)

    def _lease_key(self, lease: str) -> str:
        return self._key("leader", lease) if lease else self._key("leader")

    async def acquire_lease(self, lease: str, holder: str, ttl: float) -> bool:
        async with self._reach("acquire_lease", self._op_timeout):
            held = await self._acquire(keys=[self._lease_key(lease)], args=[holder, _ms(ttl)])
        return bool(held)

    async def renew_lease(self, lease: str, holder: str, ttl: float) -> bool:
        async with self._reach("renew_lease", self._op_timeout):
            renewed = await self._renew_lease(keys=[self._lease_key(lease)], args=[holder, _ms(ttl)])
        return bool(renewed)

    async def release_lease(self, lease: str, holder: str) -> None:
        async with self._reach("release_lease", self._op_timeout):
            await self._release(keys=[self._lease_key(lease)], args=[holder])

    async def lease_holders(self, leases: Sequence[str]) -> dict[str, str | None]:
        if not leases:
            return {}
        async with self._reach("lease_holders", self._op_timeout):
            holders: list[Any] = await self._redis.mget([self._lease_key(lease) for lease in leases])
        return {lease: None if h is None else _text(h) for lease, h in zip(leases, holders, strict=True)}

    async def send(self, batches: Mapping[str, Sequence[bytes]]) -> None:
        if not any(batches.values()):
            return
        async with self._reach("send", self._op_timeout):
            pipe = self._sender.pipeline(transaction=False)
            for to, messages in batches.items():
                if not messages:
                    continue
                inbox = inbox_key(self._prefix, to)
                for message in messages:
                    pipe.xadd(inbox, {b"m": message}, maxlen=self._inbox_limit, approximate=True)
                pipe.expire(inbox, INBOX_IDLE_SECONDS)
            await pipe.execute()

    async def receive(self, me: str, timeout: float) -> list[bytes]:
        inbox = inbox_key(self._prefix, me)
        block = _ms(timeout) if timeout > 0 else None  # BLOCK 0 would wait forever
        async with self._reach("receive", max(timeout, 0.0) + self._op_timeout):
            await self._reader.initialize()
            if self._reader.connection is not None:  # reconnect now, so a new connection's check comes first
                await self._reader.connection.connect()  # type: ignore[no-untyped-call]
            if self._checked_epoch.get(me) != self._reader_epoch:
                await self._check_cursor(me, inbox)
            cursor = self._cursor.get(me, b"0-0")
            reply: Any = await self._reader.xread({inbox: cursor}, count=self._read_batch, block=block)
        if not reply:  # RESP2: [[stream, [(id, {field: value}), ...]]], nothing when the block timed out
            return []
        entries: list[tuple[bytes, dict[bytes, bytes]]] = reply[0][1]
        if entries:
            self._cursor[me] = entries[-1][0]
        return [fields[b"m"] for _, fields in entries if b"m" in fields]  # an entry not ours: skipped

    async def _check_cursor(self, me: str, inbox: str) -> None:
        """After the reading connection (re)connects: start the inbox over when the stream no longer holds
        the cursor's past (the store restarted empty, or the inbox expired)."""
        epoch = self._reader_epoch
        cursor = self._cursor.get(me, b"0-0")
        if cursor != b"0-0":
            newest: Any = await self._reader.xrevrange(inbox, count=1)
            if not newest or _stream_id(newest[0][0]) < _stream_id(cursor):
                log.warning("cluster inbox restarted: the store lost it; reading it from its start", replica=me)
                self._cursor[me] = b"0-0"
        self._checked_epoch[me] = epoch

    async def aclose(self) -> None:
        await self._reader.aclose()
        await self._sender.aclose()
        await self._redis.aclose()

"""CN's workload: many followers' traffic against one real leader, without their clients or engines: the
leader's CPU per request at the load of many busy followers, which real followers on a small machine cannot
produce (each costs several times what the leader does per request).

`SyntheticFollowers` joins the cluster under `followers` replica names and plays, for each request, what a
replica's `Follower` sends its model's leader: the `Admit`; on the `Grant` the `accepted` report, the
`first_token` report `first_token_after` later, one `Tokens` message per report interval for all of that
follower's running requests, and the final count and `ended` report `request_seconds` after the grant. It
reads what the leader sends back (Verdict, Grant, Position, Fail). The leader sees the entries the followers
would have written, one per follower and moment; the driver writes all that is due at one tick in one
pipeline and reads every follower's inbox in one blocking XREAD, so it costs a fraction of what the leader
does per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from bench.product import (
    INBOX_LIMIT,
    Admit,
    Fail,
    Grant,
    Message,
    RedisStore,
    Report,
    Tokens,
    Verdict,
    decode_batch,
    encode_batch,
    inbox_key,
)
from bench.records import percentile

TICK = 0.002  # seconds between the driver's writes: what is due within one tick leaves together
GRACE_SECONDS = 30.0  # after the offered window: how long requests still waiting for a grant are waited for


@dataclass
class _Running:
    follower: int
    tokens_left: int
    unreported: int = 0


@dataclass
class LoadFigures:
    """One load step, as the driver saw it."""

    rate: float  # offered requests/s
    seconds: float = 0.0
    admitted: int = 0
    granted: int = 0
    ended: int = 0
    refused: int = 0
    failed: int = 0
    grant_latency: list[float] = field(default_factory=list)  # Admit written -> Grant read, seconds
    driver_cpu: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "seconds": self.seconds,
            "admitted": self.admitted,
            "granted": self.granted,
            "ended": self.ended,
            "refused": self.refused,
            "failed": self.failed,
            "grant_latency_p50": percentile(self.grant_latency, 50),
            "grant_latency_p99": percentile(self.grant_latency, 99),
            "driver_cpu": self.driver_cpu,
        }


class SyntheticFollowers:
    """`followers` pretend replicas sending one model's requests to its leader (see the module docstring)."""

    def __init__(
        self,
        redis_url: str,
        key_prefix: str,
        leader: str,
        model: str,
        *,
        followers: int = 10,
        tokens: int = 64,
        request_seconds: float = 2.0,
        first_token_after: float = 0.03,
        report_interval: float = 0.25,
        heartbeat: tuple[float, float] = (0.5, 2.0),
        users: int = 8,
        priority_class: str = "standard",
    ) -> None:
        self._prefix = key_prefix
        self._leader_inbox = inbox_key(key_prefix, leader)
        self._model = model
        self._names = [f"synthetic-{i + 1}" for i in range(followers)]
        self._tokens = tokens
        self._seconds = request_seconds
        self._first_token_after = first_token_after
        self._report_interval = report_interval
        self._interval, self._ttl = heartbeat
        self._users = users
        self._class = priority_class
        self._token = uuid.uuid4().hex
        self._membership = RedisStore(redis_url, key_prefix=key_prefix)
        self._writer = aioredis.Redis.from_url(redis_url, protocol=2)
        self._reader = aioredis.Redis.from_url(redis_url, protocol=2, single_connection_client=True)
        self._cursors: dict[str, str] = {}
        self._outgoing: dict[int, list[Message]] = {}
        self._timers: list[tuple[float, int, str, str]] = []  # (due, seq, kind, request id)
        self._seq = 0
        self._running: dict[str, _Running] = {}
        self._admitted_at: dict[str, float] = {}  # admitted, not granted yet
        self._owners: dict[str, int] = {}  # request id -> its follower, until granted
        self._figures = LoadFigures(0.0)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for name in self._names:
            await self._membership.join(name, self._token, self._ttl)
            self._cursors[inbox_key(self._prefix, name)] = "0-0"  # a new name's inbox: read all of it
        self._tasks = [asyncio.create_task(self._renew()), asyncio.create_task(self._read())]

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for name in self._names:
            with contextlib.suppress(Exception):
                await self._membership.leave(name, self._token)
        await self._membership.aclose()
        await self._writer.aclose()
        await self._reader.aclose()

    async def run(self, rate: float, seconds: float) -> LoadFigures:
        """Offer `rate` requests/s for `seconds`, then wait until the requests granted so far ended."""
        figures = self._figures = LoadFigures(rate)
        cpu0 = time.process_time()
        started = time.monotonic()
        sent = 0
        next_flush = started + self._report_interval
        while True:
            now = time.monotonic()
            due = min(int((now - started) * rate), int(seconds * rate))
            for n in range(sent, due):
                self._admit(n)
            sent = due
            self._fire(now)
            if now >= next_flush:
                self._flush_tokens()
                next_flush = now + self._report_interval
            await self._write()
            if (
                sent >= int(seconds * rate)
                and not self._running
                and (not self._admitted_at or now - started > seconds + 3 * self._seconds + 10)
            ):
                break
            await asyncio.sleep(TICK)
        figures.seconds = time.monotonic() - started
        figures.driver_cpu = time.process_time() - cpu0
        return figures

    # -- what a follower sends -----------------------------------------------------------------------
    def _post(self, follower: int, message: Message) -> None:
        self._outgoing.setdefault(follower, []).append(message)

    def _admit(self, n: int) -> None:
        follower = n % len(self._names)
        rid = f"s{uuid.uuid4().hex[:16]}"
        prompt = f"Synthetic request {n}: summarise this paragraph for me please."
        self._admitted_at[rid] = time.monotonic()
        self._owners[rid] = follower
        self._figures.admitted += 1
        self._post(
            follower,
            Admit(
                sender=self._names[follower],
                request_id=rid,
                model=self._model,
                user=f"user{n % self._users}",
                priority_class=self._class,
                client_request_id="",
                text=prompt,
                prompt_chars=len(prompt),
                prompt_bytes=len(prompt),
                max_tokens=self._tokens,
                age=0.0,
                remaining=None,
                cache_key="",
                watch=True,
            ),
        )

    def _later(self, at: float, kind: str, rid: str) -> None:
        self._seq += 1
        heapq.heappush(self._timers, (at, self._seq, kind, rid))

    def _fire(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, kind, rid = heapq.heappop(self._timers)
            state = self._running.get(rid)
            if state is None:
                continue
            name = self._names[state.follower]
            if kind == "first_token":
                self._post(state.follower, Report(name, rid, "first_token"))
            elif kind == "end":
                del self._running[rid]
                left = state.unreported + state.tokens_left
                if left:
                    self._post(state.follower, Tokens(name, {rid: left}))
                self._post(
                    state.follower,
                    Report(
                        name,
                        rid,
                        "ended",
                        outcome="completed",
                        finish_reason="length",
                        prompt_tokens=8,
                        completion_tokens=self._tokens,
                    ),
                )
                self._figures.ended += 1

    def _flush_tokens(self) -> None:
        """One Tokens message per follower for its running requests, as a follower's flush timer sends."""
        per_flush = max(1, round(self._tokens * self._report_interval / self._seconds))
        counts: dict[int, dict[str, int]] = {}
        for rid, state in self._running.items():
            generated = min(per_flush, state.tokens_left)
            if generated:
                state.tokens_left -= generated
                counts.setdefault(state.follower, {})[rid] = generated
        for follower, batch in counts.items():
            self._post(follower, Tokens(self._names[follower], batch))

    async def _write(self) -> None:
        if not self._outgoing:
            return
        outgoing, self._outgoing = self._outgoing, {}
        pipe = self._writer.pipeline(transaction=False)
        for messages in outgoing.values():
            for entry in encode_batch(messages):
                pipe.xadd(self._leader_inbox, {b"m": entry}, maxlen=INBOX_LIMIT, approximate=True)
        await pipe.execute()

    # -- what the leader sends back --------------------------------------------------------------------
    async def _read(self) -> None:
        while True:
            reply: Any = await self._reader.xread(self._cursors, count=1000, block=100)  # type: ignore[arg-type]
            now = time.monotonic()
            for stream, entries in reply or []:
                key = stream.decode() if isinstance(stream, bytes) else stream
                if entries:
                    self._cursors[key] = entries[-1][0]
                for _, fields in entries:
                    for message in decode_batch(fields.get(b"m", b"[]")):
                        self._on(message, now)

    def _on(self, message: object, now: float) -> None:
        figures = self._figures
        if isinstance(message, Grant):
            admitted = self._admitted_at.pop(message.request_id, None)
            if admitted is None:
                return
            figures.granted += 1
            figures.grant_latency.append(now - admitted)
            state = self._running[message.request_id] = _Running(self._owners.pop(message.request_id), self._tokens)
            self._post(state.follower, Report(self._names[state.follower], message.request_id, "accepted"))
            self._later(now + self._first_token_after, "first_token", message.request_id)
            self._later(now + self._seconds, "end", message.request_id)
        elif isinstance(message, Verdict) and message.error is not None:
            self._forget(message.request_id)
            figures.refused += 1
        elif isinstance(message, Fail):
            self._forget(message.request_id)
            figures.failed += 1

    def _forget(self, rid: str) -> None:
        self._admitted_at.pop(rid, None)
        self._owners.pop(rid, None)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            for name in self._names:
                await self._membership.renew(name, self._token, self._ttl)

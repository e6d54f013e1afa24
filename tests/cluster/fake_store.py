"""An in-memory `ClusterStore` for unit tests: the semantics of `scheduler_svc.cluster.store`, in one process.

Several replicas in one test share one `FakeStoreBackend` through their own `FakeStore` handles. `down()`
makes every handle raise StoreUnavailable (Redis stopped); `restart_empty()` brings it back with nothing in
it (Redis restarted without persistence). Expiry follows `clock` (monotonic seconds), so a test can move
time instead of sleeping; inside `time_stopped()` the store's time stands still, so a test whose premise is
that a name or lease outlives a stretch of real time holds it by construction, however slow the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler_svc.cluster.store import DuplicateReplica, StoreUnavailable

INBOX_LIMIT = 100_000


@dataclass
class FakeStoreBackend:
    """The shared state: what one Redis would hold."""

    clock: Callable[[], float] = time.monotonic
    inbox_limit: int = INBOX_LIMIT
    up: bool = True
    names: dict[str, tuple[str, float]] = field(default_factory=dict)  # name -> (token, expires at)
    leases: dict[str, tuple[str, float]] = field(default_factory=dict)  # lease -> (holder, expires at)
    inboxes: dict[str, list[bytes]] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)  # per inbox: entries trimmed off its front so far
    generation: int = 0  # bumped by restart_empty: readers' positions from before point into nothing
    arrived: dict[str, asyncio.Event] = field(default_factory=dict)
    stopped_at: float | None = None  # `clock`'s reading when the store's time stopped (None: it runs)
    stopped_for: float = 0.0  # seconds of `clock` the store's time stood still, all stops together

    def now(self) -> float:
        """The store's time, which expiry follows: `clock`, less the stretches it stood still."""
        return (self.clock() if self.stopped_at is None else self.stopped_at) - self.stopped_for

    @contextlib.contextmanager
    def time_stopped(self) -> Iterator[None]:
        """Within, no name or lease ages: each keeps the life it had left, and after, goes on from there."""
        assert self.stopped_at is None, "the store's time is already stopped"
        self.stopped_at = self.clock()
        try:
            yield
        finally:
            self.stopped_for += self.clock() - self.stopped_at
            self.stopped_at = None

    def down(self) -> None:
        self.up = False
        for event in self.arrived.values():
            event.set()  # blocked readers notice at once, as a dropped connection would tell them

    def restart_empty(self) -> None:
        self.up = True
        self.names.clear()
        self.leases.clear()
        self.inboxes.clear()
        self.dropped.clear()
        self.generation += 1
        for event in self.arrived.values():
            event.set()  # blocked readers lose their connection, as with a restarted Redis

    def check(self) -> None:
        if not self.up:
            raise StoreUnavailable("fake store is down")

    def live(self, name: str) -> tuple[str, float] | None:
        entry = self.names.get(name)
        if entry is not None and entry[1] <= self.now():
            del self.names[name]
            return None
        return entry

    def end_of(self, inbox: str) -> int:
        """The position after the newest entry (positions count every entry ever added, trimmed or not)."""
        return self.dropped.get(inbox, 0) + len(self.inboxes.get(inbox, []))

    def lease_now(self, lease: str) -> tuple[str, float] | None:
        held = self.leases.get(lease)
        if held is not None and held[1] <= self.now():
            del self.leases[lease]
            return None
        return held


class FakeStore:
    """One replica's handle on a `FakeStoreBackend`."""

    def __init__(self, backend: FakeStoreBackend) -> None:
        self.b = backend
        self.ops = 0  # round trips made, for cost assertions
        # per inbox read: (store generation, position read up to); set at this handle's first join of the
        # name, so a new process never reads what was sent to an earlier one of the same name
        self.read_upto: dict[str, tuple[int, int]] = {}

    def _op(self) -> None:
        self.b.check()
        self.ops += 1

    async def join(self, name: str, token: str, ttl: float) -> None:
        self._op()
        entry = self.b.live(name)
        if entry is not None and entry[0] != token:
            raise DuplicateReplica(f"replica name {name} is held by another live replica")
        self.b.names[name] = (token, self.b.now() + ttl)
        self.read_upto.setdefault(name, (self.b.generation, self.b.end_of(name)))

    async def renew(self, name: str, token: str, ttl: float) -> bool:
        self._op()
        entry = self.b.live(name)
        if entry is None or entry[0] != token:
            return False
        self.b.names[name] = (token, self.b.now() + ttl)
        return True

    async def leave(self, name: str, token: str) -> None:
        self._op()
        entry = self.b.live(name)
        if entry is not None and entry[0] == token:
            del self.b.names[name]

    async def members(self) -> list[str]:
        self._op()
        return sorted(n for n in list(self.b.names) if self.b.live(n) is not None)

    async def acquire_lease(self, lease: str, holder: str, ttl: float) -> bool:
        self._op()
        held = self.b.lease_now(lease)
        if held is None:
            self.b.leases[lease] = (holder, self.b.now() + ttl)
            return True
        return held[0] == holder

    async def renew_lease(self, lease: str, holder: str, ttl: float) -> bool:
        self._op()
        held = self.b.lease_now(lease)
        if held is None or held[0] != holder:
            return False
        self.b.leases[lease] = (holder, self.b.now() + ttl)
        return True

    async def release_lease(self, lease: str, holder: str) -> None:
        self._op()
        held = self.b.lease_now(lease)
        if held is not None and held[0] == holder:
            del self.b.leases[lease]

    async def lease_holders(self, leases: Sequence[str]) -> dict[str, str | None]:
        self._op()
        out: dict[str, str | None] = {}
        for lease in leases:
            held = self.b.lease_now(lease)
            out[lease] = None if held is None else held[0]
        return out

    async def send(self, batches: Mapping[str, Sequence[bytes]]) -> None:
        self._op()
        for to, messages in batches.items():
            inbox = self.b.inboxes.setdefault(to, [])
            inbox.extend(messages)
            if len(inbox) > self.b.inbox_limit:
                dropped = len(inbox) - self.b.inbox_limit
                del inbox[:dropped]
                self.b.dropped[to] = self.b.dropped.get(to, 0) + dropped
            self.b.arrived.setdefault(to, asyncio.Event()).set()

    def _unread_from(self, me: str) -> int:
        generation, upto = self.read_upto.get(me, (self.b.generation, 0))
        return upto if generation == self.b.generation else 0  # the store restarted empty: from its start

    async def receive(self, me: str, timeout: float) -> list[bytes]:
        self._op()
        event = self.b.arrived.setdefault(me, asyncio.Event())
        if self.b.end_of(me) <= self._unread_from(me):
            event.clear()
            generation = self.b.generation
            try:
                async with asyncio.timeout(timeout):
                    await event.wait()
            except TimeoutError:
                return []
            self.b.check()
            if self.b.generation != generation:
                raise StoreUnavailable("fake store restarted")
        start = max(self._unread_from(me), self.b.dropped.get(me, 0))
        self.read_upto[me] = (self.b.generation, self.b.end_of(me))
        return self.b.inboxes.get(me, [])[start - self.b.dropped.get(me, 0) :]

    async def aclose(self) -> None:
        return None

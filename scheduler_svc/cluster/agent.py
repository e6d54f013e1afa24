"""One replica's cluster agent: its role, its heartbeat, its inbox.

Roles: joining (until the first look at the lease) -> following or leading; degraded whenever the store
does not answer; back to joining -> following/leading when it answers again (re-registering every live
ticket with the leader). Each role sets the dispatchers' authority (`modes`).

Heartbeat, every heartbeat_interval_seconds (a Stepdown message or a store error makes it look at once):
renew membership (join again when it was lost: store restarted empty), renew the lease (leader) or try to
take it (others), read who holds it (when not us) and the members (the leader releases dead owners'
mirrors; everyone keeps the count for the degraded cap). Store operations per heartbeat: leader 3
(renew, renew_lease, members), follower 4 (renew, acquire_lease, lease_holder, members).

Inbox: one blocking `receive` per wake-up returns every message that arrived; each is handed to the
`Leader` or `Follower` part. Sending goes through the `Outbox` (one `send` per destination per wake-up).

Stopping (SIGTERM): `step_down` releases the lease and sends Stepdown to every member at once (they take
the lead at their next look), then the replica follows while the server drains (its outcomes still reach
the new leader); `aclose` leaves the membership. `kill` stops everything at once, sending nothing (tests
use it for a crashed process).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import structlog

from scheduler_svc.cluster.follower import Follower
from scheduler_svc.cluster.leader import Leader
from scheduler_svc.cluster.messages import (
    Admit,
    Fail,
    Grant,
    Message,
    MessageError,
    Position,
    Report,
    Stepdown,
    Verdict,
    decode,
    type_name,
)
from scheduler_svc.cluster.metrics import ClusterMetrics
from scheduler_svc.cluster.modes import Role, authority_for
from scheduler_svc.cluster.outbox import Outbox
from scheduler_svc.cluster.store import ClusterStore, DuplicateReplica, StoreTimeout, StoreUnavailable
from scheduler_svc.config import ClusterConfig
from scheduler_svc.dispatch.scheduler import Scheduler

log = structlog.get_logger(__name__)

CANCEL_AGAIN_SECONDS = 0.1  # a loop still running this long after its cancellation lost it: cancel it again


class ClusterAgent:
    """Makes one `Scheduler` a replica of the cluster that meets on `store`."""

    def __init__(self, scheduler: Scheduler, store: ClusterStore, cluster: ClusterConfig, name: str) -> None:
        self.scheduler = scheduler
        self.store = store
        self.cluster = cluster
        self.name = name
        self._token = uuid.uuid4().hex  # proves the membership is ours
        self.holder = self._new_holder()
        self.metrics = ClusterMetrics(scheduler.metrics.registry)
        self.role = Role.JOINING
        self.members = 1  # last known number of live replicas (for the degraded cap)
        self._joined = False
        self._stepping_down = False
        self._killed = False
        self._look_now = asyncio.Event()
        self.outbox = Outbox(store, self.metrics, self._store_failed)
        self.follower = Follower(scheduler, name, cluster, self.outbox.post, self.metrics)
        self.leader = Leader(scheduler, name, lambda: self.holder, self.outbox.post)
        self._tasks: list[asyncio.Task[None]] = []
        self.role_changed = asyncio.Event()  # set on every role change (tests wait on it)

    def _new_holder(self) -> str:
        """A lease holder string of its own for each term as leader: a grant sent in an earlier term is
        never taken for one of this term (an owner accepts grants only from the holder it registered with)."""
        return f"{self.name}/{uuid.uuid4().hex}"

    @property
    def leader_holder(self) -> str | None:
        return self.holder if self.role is Role.LEADING else self.follower.leader

    # -- life ----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Join (a duplicate name raises `DuplicateReplica`: the process must not start), install the
        hooks, start the loops. An unreachable store is not fatal: the replica starts degraded."""
        try:
            await self.store.join(self.name, self._token, self.cluster.heartbeat_timeout_seconds)
            self._joined = True
        except StoreUnavailable as exc:
            self._store_failed(exc)
        self.scheduler.guard = self.follower
        for dispatcher in self.scheduler.dispatchers.values():
            dispatcher.cluster.observe(self.follower)
        self._apply(self.role if self.role is Role.DEGRADED else Role.JOINING)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._heartbeat(), name=f"cluster-heartbeat:{self.name}"),
            loop.create_task(self._inbox(), name=f"cluster-inbox:{self.name}"),
            loop.create_task(self.outbox.run(), name=f"cluster-outbox:{self.name}"),
        ]
        log.info("cluster_replica_started", replica=self.name, store=type(self.store).__name__)

    async def step_down(self) -> None:
        """SIGTERM: hand the lead over at once (release the lease, tell every member), then follow."""
        self._stepping_down = True
        if self.role is not Role.LEADING or self._killed:
            return
        with contextlib.suppress(StoreUnavailable):
            await self.store.release_lease(self.holder)
            for member in await self.store.members():
                if member != self.name:
                    self.outbox.post(member, Stepdown(self.name))
        self._apply(Role.FOLLOWING, None)
        await self.outbox.flush(self.cluster.heartbeat_interval_seconds)
        log.info("cluster_stepped_down", replica=self.name)

    async def aclose(self) -> None:
        """After the drain: send what is left, stop the loops, leave the membership, close the store."""
        if self._killed:
            return
        await self.outbox.flush(self.cluster.heartbeat_interval_seconds)
        await self._cancel_tasks()
        with contextlib.suppress(StoreUnavailable):
            if self.role is Role.LEADING:
                await self.store.release_lease(self.holder)
            await self.store.leave(self.name, self._token)
        self._detach()
        await self.store.aclose()

    async def kill(self) -> None:
        """Stop at once, sending nothing and releasing nothing, as a crashed process would."""
        self._killed = True
        self.outbox.clear()
        await self._cancel_tasks()
        self._detach()
        self.leader.leading = False

    async def _cancel_tasks(self) -> None:
        """Cancel the loops and wait until each one has ended, cancelling again while it runs on: on Python
        3.11 one cancellation can be lost (redis-py writes under `asyncio.wait_for`, which returns the write's
        result instead of raising when the cancellation lands as the write completes; fixed in 3.12), and the
        loop would then run forever, so that a SIGTERM'd replica never exits."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            while not task.done():
                await asyncio.wait([task], timeout=CANCEL_AGAIN_SECONDS)
                task.cancel()  # no-op once it ended
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def _detach(self) -> None:
        self.scheduler.guard = None
        for dispatcher in self.scheduler.dispatchers.values():
            dispatcher.cluster.observe(None)

    # -- roles ---------------------------------------------------------------------------------------------
    def _apply(self, role: Role, holder: str | None = None) -> None:
        """Enter `role` (following `holder`): authorities, mirrors, registration, log and gauge."""
        previous = self.role
        if role is not previous:
            if previous is Role.LEADING:
                self.leader.stop()
                self.holder = self._new_holder()
            if role is Role.LEADING:
                self.follower.stop_following()
                self.leader.start()
            elif role is Role.DEGRADED:
                self.follower.stop_following()
            self.role = role
            for model in self.scheduler.config.models:
                self.scheduler.dispatchers[model.name].cluster.steer(
                    authority_for(role, self.cluster, model, self.members, self.follower.positions)
                )
            log.info(
                "cluster_role_changed",
                replica=self.name,
                role=role.value,
                previous=previous.value,
                leader=holder.split("/", 1)[0] if holder else (self.name if role is Role.LEADING else None),
                members=self.members,
            )
            self.metrics.show_role(role)
            self.role_changed.set()
        if role in (Role.FOLLOWING, Role.JOINING):
            self.follower.follow(holder)

    def _store_failed(self, exc: StoreUnavailable) -> None:
        self.metrics.store_errors.inc()
        if self.role is not Role.DEGRADED:
            log.warning("cluster_store_unavailable", replica=self.name, error=str(exc))
            self._joined = False
            self._apply(Role.DEGRADED)
        self._look_now.set()

    # -- loops ---------------------------------------------------------------------------------------------
    async def _heartbeat(self) -> None:
        while True:
            try:
                await self._beat()
            except StoreUnavailable as exc:
                self._store_failed(exc)
            except DuplicateReplica as exc:  # our name expired and another live process took it
                log.error("cluster_name_taken", replica=self.name, error=str(exc))
                self._store_failed(StoreUnavailable(str(exc)))  # gate alone, capped, and keep trying
            except Exception as exc:  # a bug must not stop the heartbeat
                self.scheduler.errors.report("cluster", exc, loop="heartbeat")
            self._look_now.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cluster.heartbeat_interval_seconds):
                    await self._look_now.wait()

    async def _beat(self) -> None:
        store, ttl = self.store, self.cluster.heartbeat_timeout_seconds
        if not self._joined or not await store.renew(self.name, self._token, ttl):
            await store.join(self.name, self._token, ttl)  # DuplicateReplica: another process took our name
            self._joined = True
            if self.role is not Role.DEGRADED and self.role is not Role.JOINING:
                log.warning("cluster_membership_lost", replica=self.name)
                self._apply(Role.JOINING)  # the store forgot us: look at the lease and register again
        if self.role is Role.LEADING and not await store.renew_lease(self.holder, ttl):
            log.warning("cluster_lease_lost", replica=self.name)
            self._apply(Role.JOINING)
        read_at = self.scheduler.clock.now()
        members = await store.members()
        self.members = max(1, len(members))
        if self.role is Role.LEADING:
            self.leader.release_dead(members, read_at)
            return
        if not self._stepping_down and await store.acquire_lease(self.holder, ttl):
            self._apply(Role.LEADING)
            return
        holder = await store.lease_holder()
        if holder is not None and holder != self.holder and holder.split("/", 1)[0] == self.name:
            # An earlier term of ours: a store hiccup cost us the lead before the lease expired. Nobody else
            # leads on it, so free it and lead again now, rather than follow (and register with) ourselves.
            await store.release_lease(holder)
            if not self._stepping_down and await store.acquire_lease(self.holder, ttl):
                self._apply(Role.LEADING)
                return
            holder = await store.lease_holder()
        if self.role is Role.DEGRADED:
            self._apply(Role.JOINING)  # back: register everything with whoever leads now
            self.follower.leader = None
        self._apply(Role.FOLLOWING, holder if holder != self.holder else None)

    async def _inbox(self) -> None:
        while True:
            try:
                raw = await self.store.receive(self.name, self.cluster.heartbeat_interval_seconds)
            except StoreTimeout as exc:  # late, not necessarily down: read again; the heartbeat judges outages
                self.metrics.store_errors.inc()
                log.debug("cluster_inbox_read_late", replica=self.name, error=str(exc))
                continue
            except StoreUnavailable as exc:
                self._store_failed(exc)
                await asyncio.sleep(self.cluster.heartbeat_interval_seconds)  # the store is down: retry period
                continue
            except Exception as exc:  # a bug must not stop the inbox
                self.scheduler.errors.report("cluster", exc, loop="inbox")
                await asyncio.sleep(self.cluster.heartbeat_interval_seconds)
                continue
            for data in raw:
                try:
                    message = decode(data)
                except MessageError as exc:
                    self.metrics.received.labels("invalid").inc()
                    log.warning("cluster_message_invalid", replica=self.name, error=str(exc))
                    continue
                self.metrics.received.labels(type_name(message)).inc()
                try:
                    self._handle(message)
                except Exception as exc:  # a bug handling one message must not stop the inbox
                    self.scheduler.errors.report("cluster", exc, message=type_name(message))

    def _handle(self, message: Message) -> None:
        if isinstance(message, Admit):
            if self.role is Role.LEADING:
                self.leader.on_admit(message)
        elif isinstance(message, Report):
            self.leader.on_report(message)
        elif isinstance(message, Verdict):
            self.follower.on_verdict(message)
        elif isinstance(message, Grant):
            self.follower.on_grant(message)
        elif isinstance(message, Fail):
            self.follower.on_fail(message)
        elif isinstance(message, Position):
            self.follower.on_position(message)
        elif isinstance(message, Stepdown):
            self._look_now.set()

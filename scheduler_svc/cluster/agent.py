"""One replica's cluster agent: its role on each lease, its heartbeat, its inbox.

Leases (`leases.lease_plan`): one per model, so each model's decisions are led by one replica and different
models by different replicas (one lease for every model when fairness counters are global). On each lease a
replica is joining (until its first look) -> following or leading; on all of them degraded whenever the store
does not answer, back to joining -> following/leading when it answers again (re-registering every live ticket
with each lease's leader). Each lease's role sets its models' dispatcher authorities (`modes`).

Heartbeat, every heartbeat_interval_seconds (a Stepdown message or a store error makes it look at once):
renew membership (join again when it was lost: store restarted empty), renew each lease it holds, read the
members (a leader releases dead owners' mirrors; everyone keeps the count for the degraded cap and the
share of leases), read who holds every other lease in one round trip, and take the free ones its share allows
(`leases` explains the spreading); a replica over its share hands one lease over. Store operations per
heartbeat: 3 + one per lease held (renew, renew_lease each, members, lease_holders), plus one acquire per
free lease taken or one release per lease handed over. A lease handed over that nobody took comes back by
the free-lease rule; then nothing more is handed over until the members change (one of them takes no lease:
it is draining after SIGTERM), so leases do not swing back and forth.

Inbox: one blocking `receive` per wake-up returns every entry that arrived; each entry is a batch of messages,
each handed to the `Leader` or `Follower` part. Sending goes through the `Outbox` (one entry per destination
per wake-up).

Stopping (SIGTERM): `step_down` releases every lease it holds and sends Stepdown to every member at once (they
take the leases at their next look), then the replica follows while the server drains (its outcomes still
reach the new leaders); `aclose` leaves the membership. `kill` stops everything at once, sending nothing
(tests use it for a crashed process).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass

import structlog

from scheduler_svc.cluster.follower import Follower
from scheduler_svc.cluster.leader import Leader
from scheduler_svc.cluster.leases import fair_share, lease_plan
from scheduler_svc.cluster.messages import (
    Admit,
    Fail,
    Grant,
    Message,
    MessageError,
    Position,
    Report,
    Roster,
    Stepdown,
    Tokens,
    Verdict,
    decode_batch,
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


@dataclass
class LeaseState:
    """This replica's standing on one lease."""

    name: str
    models: tuple[str, ...]
    holder: str  # our holder string for the lease: a new one for each term we lead it
    role: Role = Role.JOINING
    free_looks: int = 0  # consecutive looks that found the lease free


class ClusterAgent:
    """Makes one `Scheduler` a replica of the cluster that meets on `store`."""

    def __init__(self, scheduler: Scheduler, store: ClusterStore, cluster: ClusterConfig, name: str) -> None:
        self.scheduler = scheduler
        self.store = store
        self.cluster = cluster
        self.name = name
        self._token = uuid.uuid4().hex  # proves the membership is ours
        plan = lease_plan(scheduler.config)
        self.leases = {lease: LeaseState(lease, models, self._new_holder()) for lease, models in plan.items()}
        self._lease_of = {model: lease for lease, models in plan.items() for model in models}
        self.metrics = ClusterMetrics(scheduler.metrics.registry, list(self._lease_of))
        self.members = 1  # last known number of live replicas (for the degraded cap and the share of leases)
        self._joined = False
        self._stepping_down = False
        self._member_names: frozenset[str] = frozenset()  # the members at the last look
        # The members when a lease we handed over came back to us for want of a taker (a member that never
        # takes leases: one draining after SIGTERM). While they stay the same, nothing is handed over again.
        self._keep_leases_among: frozenset[str] | None = None
        self._killed = False
        self._look_now = asyncio.Event()
        # Clear while a take of a lease waits for the store's answer: the inbox holds what it read until then.
        self._no_take_pending = asyncio.Event()
        self._no_take_pending.set()
        self.outbox = Outbox(store, self.metrics, self._store_failed)
        self.follower = Follower(scheduler, name, cluster, self.outbox.post, self.metrics, plan)
        self.leader = Leader(scheduler, name, self.holder_of, self.outbox.post)
        self._tasks: list[asyncio.Task[None]] = []
        self.role_changed = asyncio.Event()  # set on every role change (tests wait on it)

    def _new_holder(self) -> str:
        """A lease holder string of its own for each term as a lease's leader: a grant sent in an earlier term
        is never taken for one of this term (an owner accepts grants only from the holder it registered with)."""
        return f"{self.name}/{uuid.uuid4().hex}"

    # -- what this replica knows -----------------------------------------------------------------------
    def lease_for(self, model: str) -> LeaseState:
        return self.leases[self._lease_of[model]]

    def holder_of(self, model: str) -> str:
        """Our holder string on `model`'s lease (what our grants carry while we lead it)."""
        return self.lease_for(model).holder

    def role_of(self, model: str) -> Role:
        return self.lease_for(model).role

    def leader_of(self, model: str) -> str | None:
        """The holder string of `model`'s leader as this replica knows it (ours while we lead it)."""
        lease = self.lease_for(model)
        return lease.holder if lease.role is Role.LEADING else self.follower.leader_of(model)

    @property
    def role(self) -> Role:
        """The replica's role over all leases: degraded, leading (at least one), following, or joining."""
        roles = {lease.role for lease in self.leases.values()}
        for role in (Role.DEGRADED, Role.LEADING, Role.FOLLOWING):
            if role in roles:
                return role
        return Role.JOINING

    @property
    def leading(self) -> list[str]:
        """The models this replica leads now."""
        return [m for lease in self.leases.values() if lease.role is Role.LEADING for m in lease.models]

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
        for lease in self.leases.values():
            self._apply(lease, lease.role if lease.role is Role.DEGRADED else Role.JOINING)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._heartbeat(), name=f"cluster-heartbeat:{self.name}"),
            loop.create_task(self._inbox(), name=f"cluster-inbox:{self.name}"),
            loop.create_task(self.outbox.run(), name=f"cluster-outbox:{self.name}"),
        ]
        log.info("cluster_replica_started", replica=self.name, store=type(self.store).__name__)

    async def step_down(self) -> None:
        """SIGTERM: hand every lease over at once (release them, tell every member), then follow."""
        self._stepping_down = True
        led = [lease for lease in self.leases.values() if lease.role is Role.LEADING]
        if not led or self._killed:
            return
        with contextlib.suppress(StoreUnavailable):
            for lease in led:
                await self.store.release_lease(lease.name, lease.holder)
            self._tell_members(await self.store.members())
        for lease in led:
            self._apply(lease, Role.FOLLOWING, None)
        await self.outbox.flush(self.cluster.heartbeat_interval_seconds)
        log.info("cluster_stepped_down", replica=self.name)

    async def aclose(self) -> None:
        """After the drain: send what is left, stop the loops, leave the membership, close the store."""
        if self._killed:
            return
        await self.outbox.flush(self.cluster.heartbeat_interval_seconds)
        await self._cancel_tasks()
        with contextlib.suppress(StoreUnavailable):
            for lease in self.leases.values():
                if lease.role is Role.LEADING:
                    await self.store.release_lease(lease.name, lease.holder)
            await self.store.leave(self.name, self._token)
        self._detach()
        await self.store.aclose()

    async def kill(self) -> None:
        """Stop at once, sending nothing and releasing nothing, as a crashed process would."""
        self._killed = True
        self.outbox.clear()
        await self._cancel_tasks()
        self._detach()
        self.leader.leading.clear()

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

    def _tell_members(self, members: list[str]) -> None:
        """Stepdown to every other member: look at the leases now."""
        for member in members:
            if member != self.name:
                self.outbox.post(member, Stepdown(self.name))

    # -- roles ---------------------------------------------------------------------------------------------
    def _apply(self, lease: LeaseState, role: Role, holder: str | None = None) -> None:
        """Enter `role` on `lease` (following `holder`): authorities, mirrors, registration, log and gauges."""
        previous = lease.role
        if role is not previous:
            if previous is Role.LEADING:
                self.leader.stop(lease.models)
                lease.holder = self._new_holder()
            if role is Role.LEADING:
                self.follower.stop_following(lease.name)
                self.leader.start(lease.models)
            elif role is Role.DEGRADED:
                self.follower.stop_following(lease.name)
            lease.role = role
            for model in self.scheduler.config.models:
                if model.name in lease.models:
                    self.scheduler.dispatchers[model.name].cluster.steer(
                        authority_for(role, self.cluster, model, self.members, self.follower.positions)
                    )
            log.info(
                "cluster_role_changed",
                replica=self.name,
                models=list(lease.models),
                role=role.value,
                previous=previous.value,
                leader=holder.split("/", 1)[0] if holder else (self.name if role is Role.LEADING else None),
                members=self.members,
            )
            self.metrics.show_role(self.role, self.leading)
            self.role_changed.set()
        if role in (Role.FOLLOWING, Role.JOINING):
            self.follower.follow(lease.name, holder)

    def _store_failed(self, exc: StoreUnavailable) -> None:
        self.metrics.store_errors.inc()
        if any(lease.role is not Role.DEGRADED for lease in self.leases.values()):
            log.warning("cluster_store_unavailable", replica=self.name, error=str(exc))
            self._joined = False
            for lease in self.leases.values():
                self._apply(lease, Role.DEGRADED)
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
            for lease in self.leases.values():
                if lease.role is not Role.DEGRADED and lease.role is not Role.JOINING:
                    log.warning("cluster_membership_lost", replica=self.name, models=list(lease.models))
                    self._apply(lease, Role.JOINING)  # the store forgot us: look at the lease and register again
        for lease in self.leases.values():
            if lease.role is Role.LEADING and not await store.renew_lease(lease.name, lease.holder, ttl):
                log.warning("cluster_lease_lost", replica=self.name, models=list(lease.models))
                self._apply(lease, Role.JOINING)
        read_at = self.scheduler.clock.now()
        members = await store.members()
        self.members = max(1, len(members))
        self._member_names = frozenset(members)
        if self.leader.leading:
            self.leader.release_dead(members, read_at)
        share = fair_share(len(self.leases), self.members)
        led = [lease for lease in self.leases.values() if lease.role is Role.LEADING]
        if len(led) > share and not self._stepping_down and self._member_names != self._keep_leases_among:
            await self._hand_over(led[-1], members)
            led.pop()
        others = [lease for lease in self.leases.values() if lease.role is not Role.LEADING]
        if not others:
            return
        holders = await store.lease_holders([lease.name for lease in others])
        for lease in others:
            if await self._look(lease, holders[lease.name], len(led) < share):
                led.append(lease)

    async def _look(self, lease: LeaseState, holder: str | None, under_share: bool) -> bool:
        """Take `lease` or follow whoever holds it; True when we lead it now."""
        store = self.store
        ours = False
        if holder is not None and holder.split("/", 1)[0] == self.name:
            # Ours, yet we do not lead on it: an earlier term (a store hiccup cost us the lead before the lease
            # expired), or this term's acquire that took effect but answered too late. Nobody else leads on it,
            # so free it and lead again now, rather than follow (and register with) ourselves, and in a term
            # of our own: the others may have registered with the holder string they saw, which ignored them.
            await store.release_lease(lease.name, holder)
            if holder == lease.holder:
                lease.holder = self._new_holder()
            holder, ours = None, True
        if holder is None:
            lease.free_looks += 1
            unclaimed = lease.free_looks > 1  # free since our last look: nobody under their share took it
            wanted = ours or under_share or unclaimed
            if not self._stepping_down and wanted and await self._take(lease):
                lease.free_looks = 0
                if unclaimed and not (ours or under_share):
                    self._keep_leases_among = self._member_names
                return True
            if wanted and not self._stepping_down:  # another replica took it just now
                holder = (await store.lease_holders([lease.name]))[lease.name]
        else:
            lease.free_looks = 0
        if lease.role is Role.DEGRADED:
            self._apply(lease, Role.JOINING)  # back: register everything with whoever leads now
            self.follower.leaders[lease.name] = None
        self._apply(lease, Role.FOLLOWING, holder if holder != lease.holder else None)
        return False

    async def _take(self, lease: LeaseState) -> bool:
        """Take the free `lease` and lead it; False when another replica took it first.

        Once the store holds our take, the other replicas read us as the lease's leader and register their
        requests with us, and those messages can reach our inbox before the store's answer reaches us. The
        inbox holds what it reads until we lead: handled earlier, they would meet a replica that does not lead
        the lease yet and be dropped, and the requests would wait at their owners for a grant forever."""
        self._no_take_pending.clear()
        try:
            if not await self.store.acquire_lease(lease.name, lease.holder, self.cluster.heartbeat_timeout_seconds):
                return False
            self._apply(lease, Role.LEADING)
            return True
        finally:
            self._no_take_pending.set()

    async def _hand_over(self, lease: LeaseState, members: list[str]) -> None:
        """Give up a lease beyond our share (replicas joined after we took it): release it and tell every
        member, so one under its share takes it at once."""
        await self.store.release_lease(lease.name, lease.holder)
        log.info("cluster_lease_handed_over", replica=self.name, models=list(lease.models), members=len(members))
        self._apply(lease, Role.FOLLOWING, None)
        self._tell_members(members)

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
            if raw:  # while a take of a lease waits for its answer, these wait to be handled by its leader
                await self._no_take_pending.wait()
            for data in raw:
                for message in decode_batch(data):
                    if isinstance(message, MessageError):
                        self.metrics.received.labels("invalid").inc()
                        log.warning("cluster_message_invalid", replica=self.name, error=str(message))
                        continue
                    self.metrics.received.labels(type_name(message)).inc()
                    try:
                        self._handle(message)
                    except Exception as exc:  # a bug handling one message must not stop the inbox
                        self.scheduler.errors.report("cluster", exc, message=type_name(message))

    def _handle(self, message: Message) -> None:
        if isinstance(message, Tokens):
            self.leader.on_tokens(message)
        elif isinstance(message, Report):
            self.leader.on_report(message)
        elif isinstance(message, Admit):
            self.leader.on_admit(message)
        elif isinstance(message, Roster):
            self.leader.on_roster(message)
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

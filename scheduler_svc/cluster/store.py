"""The port to the shared store replicas meet on: membership, the leader leases, and per-replica inboxes.

Everything the cluster shares goes through this Protocol; `redis_store.RedisStore` implements it on Redis,
and the unit tests use an in-memory fake with the same semantics (`tests/cluster/fake_store.py`), checked
by one conformance suite run against both.

Semantics every implementation keeps:
- Membership: `join` claims a replica name for `ttl` seconds with a token only this process knows; a name
  held by another live token is refused (`DuplicateReplica`). `renew` extends it and answers False when the
  name is no longer ours (expired, or the store restarted empty): the caller joins again. A name not
  renewed within its ttl disappears; `members` lists the live ones.
- Leases, each named (one per model, or "" for one covering every model), each with one holder at a time and
  independent of the others. `acquire_lease` takes one when free (and answers whether we hold it now),
  `renew_lease` extends it only while we hold it, `release_lease` frees it only if we hold it (a handover on
  SIGTERM, or to spread the leases). `lease_holders` reads who holds each of several, in one round trip. The
  holder string is opaque ("name/token").
- Inboxes: `send` appends messages to replicas' inboxes, each inbox's in order; `receive` returns the messages that
  arrived after the last ones it returned, waiting up to `timeout` for the first; a handle reads a name's
  inbox from its own first `join` of that name on (never what an earlier process of the name was sent).
  Inboxes are bounded (oldest dropped) and die with the store; a message to a dead replica is simply never
  read. A read blocked when the store restarts raises StoreUnavailable; later messages still arrive.
- Any failure to reach the store raises `StoreUnavailable`; the caller degrades and retries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class StoreError(Exception):
    """Base of the store's errors."""


class StoreUnavailable(StoreError):
    """The store cannot be reached (connection refused or lost, timeout): degrade, and try again later."""


class StoreTimeout(StoreUnavailable):
    """A call ran past its time limit. The store may be hung, or this process's own event loop too busy to
    read the answer in time: a late inbox read is retried rather than taken for an outage (the heartbeat's
    calls decide that)."""


class DuplicateReplica(StoreError):
    """Another live replica already holds this name."""


class ClusterStore(Protocol):
    """Membership, the leader lease and inboxes, shared by every replica (see the module docstring)."""

    async def join(self, name: str, token: str, ttl: float) -> None:
        """Claim `name` for `ttl` seconds; DuplicateReplica when another live token holds it."""
        ...

    async def renew(self, name: str, token: str, ttl: float) -> bool:
        """Extend our claim on `name`; False when it is not ours any more (expired, store restarted)."""
        ...

    async def leave(self, name: str, token: str) -> None:
        """Give the name up (clean shutdown); nothing when it is not ours."""
        ...

    async def members(self) -> list[str]:
        """Names of the live replicas, sorted."""
        ...

    async def acquire_lease(self, lease: str, holder: str, ttl: float) -> bool:
        """Take lease `lease` for `ttl` seconds if it is free; True when `holder` holds it now."""
        ...

    async def renew_lease(self, lease: str, holder: str, ttl: float) -> bool:
        """Extend the lease if `holder` holds it; False otherwise (it expired or another took it)."""
        ...

    async def release_lease(self, lease: str, holder: str) -> None:
        """Free the lease if `holder` holds it (atomic compare-and-delete)."""
        ...

    async def lease_holders(self, leases: Sequence[str]) -> dict[str, str | None]:
        """Who holds each of `leases` now (None: nobody), in one round trip."""
        ...

    async def send(self, batches: Mapping[str, Sequence[bytes]]) -> None:
        """Append each replica's messages to its inbox, in order (one round trip for all of them)."""
        ...

    async def receive(self, me: str, timeout: float) -> list[bytes]:
        """Messages that reached our inbox since the last call, oldest first; waits up to `timeout` seconds
        for the first (an empty list when none came)."""
        ...

    async def aclose(self) -> None:
        """Close connections."""
        ...

"""The seams through which something above the core (the cluster agent) steers dispatch: who decides,
who hears, who confirms an admission. The core defines them and never knows who implements them.

- `DispatchAuthority`: whether a dispatcher sends requests by its own decision (one process, a cluster's
  leader, a replica cut off from the others) or only when told to (`ClusterPort.grant`, a follower),
  whether its backends' metrics are scraped (one scrape per engine for a cluster, not one per replica),
  and an extra in-flight cap per backend (a replica gating alone must not fill the engine N times over).
- `DispatchObserver`: told of each local request's life (accepted, first token, tokens, failed over,
  outcome), so a follower can tell the leader, whose accounting is the cluster's.
- `AdmissionGuard`: confirms an admitted request somewhere else (the leader's global caps and duplicate-id
  rule) before the call goes on; raises the SchedulerError to answer with.

Without any of them (one process, `[cluster] store = "memory"`) nothing changes: `LOCAL` decides, scrapes
and caps nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from backends.errors import BackendError

if TYPE_CHECKING:
    from scheduler_svc.core.ticket import Ticket
    from scheduler_svc.dispatch.backend_handle import BackendHandle


class DispatchAuthority(Protocol):
    """Who decides when a dispatcher's requests go."""

    @property
    def dispatches_locally(self) -> bool:
        """True: the dispatcher's own loop sends requests; False: only `grant` does."""
        ...

    @property
    def scrapes(self) -> bool:
        """Whether the backends' metrics are read by this process now."""
        ...

    def in_flight_cap(self, handle: BackendHandle) -> int | None:
        """The most requests this process may have in flight at `handle` (None: no cap beyond its gate)."""
        ...

    def position(self, request_id: str) -> int | None:
        """The request's position in its user's queue as the deciding replica last told it (None: unknown,
        the local queue's answer stands)."""
        ...


class LocalAuthority:
    """One process deciding alone: dispatch, scrape, no extra cap."""

    dispatches_locally = True
    scrapes = True

    def in_flight_cap(self, handle: BackendHandle) -> int | None:
        return None

    def position(self, request_id: str) -> int | None:
        return None


LOCAL = LocalAuthority()


class DispatchObserver(Protocol):
    """Hears each local request's events, in the order they happen (all calls are synchronous and cheap)."""

    def on_accepted(self, ticket: Ticket) -> None: ...

    def on_first_token(self, ticket: Ticket) -> None: ...

    def on_generated(self, ticket: Ticket, tokens: int) -> None: ...

    def on_failed_over(self, ticket: Ticket, error: BackendError) -> None:
        """The backend failed the request before its first token and it waits in the queue again."""
        ...

    def on_outcome(self, ticket: Ticket) -> None: ...


class AdmissionGuard(Protocol):
    """Confirms a request just queued locally; raises a SchedulerError to refuse it (the caller closes the
    ticket as rejected)."""

    async def confirm(self, ticket: Ticket) -> None: ...

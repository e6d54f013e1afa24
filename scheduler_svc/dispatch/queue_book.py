"""The queue book: what is queued for one model, ticket by ticket, and whose place in a queue moved.

It holds the model's queues (`core.queues`: a band per priority class, a flow per user kept in the ordering
policy's order, within it a queue per end user) together with the ticket of every queued request, keeps
each class's queue-depth gauge, tells the position notifier which flows moved, and tells the tenants'
nested fairness policies (`end_users`) what is queued and what leaves. It decides nothing: dispatch takes
requests out of it and, after a failover, puts them back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from scheduler_svc.config import PriorityClassConfig
from scheduler_svc.core.queues import Band, Flow, ModelQueues, OrderKeyFn
from scheduler_svc.core.ticket import Ticket
from scheduler_svc.dispatch.end_users import EndUserShares
from scheduler_svc.dispatch.positions import PositionNotifier


class QueueBook:
    """Every queued request of one model, with its ticket; `show_depth(class, size)` sets a class's gauge;
    `end_users` chooses among a tenant's end users (without it: none are told apart)."""

    def __init__(
        self,
        classes: Sequence[PriorityClassConfig],
        order_key: OrderKeyFn,
        show_depth: Callable[[str, int], None] = lambda priority_class, size: None,
        end_users: EndUserShares | None = None,
    ) -> None:
        self.end_users = end_users if end_users is not None else EndUserShares()
        self._queues = ModelQueues(classes, order_key, self.end_users.choose)
        self._tickets: dict[str, Ticket] = {}  # request id -> ticket, for every queued request
        self._positions = PositionNotifier(self._tickets)
        self._show_depth = show_depth

    def __len__(self) -> int:
        return self._queues.size

    def ticket(self, request_id: str) -> Ticket | None:
        """The queued request's ticket, None when it is not queued here."""
        return self._tickets.get(request_id)

    def tickets(self) -> list[Ticket]:
        return list(self._tickets.values())

    def put(self, ticket: Ticket, *, front: bool = False) -> tuple[Flow, bool]:
        """Queue the ticket's request where the ordering puts it (with `front`, at the head of its user's
        queue); returns its flow and whether its user just became backlogged in the band. The requests the
        ordering put behind it moved back one: their streaming clients are told."""
        request = ticket.request
        flow, newly_backlogged = self._queues.push(request, front=front)
        self._tickets[request.request_id] = ticket
        self.end_users.queued(request, flow)
        if not flow.is_last(request):
            self._positions.moved(flow)
        self._show_depth(request.priority_class, self._queues.band(request.priority_class).size)
        return flow, newly_backlogged

    def take(self, ticket: Ticket, *, dispatched: bool = False) -> bool:
        """Take a still-queued request out (`dispatched`, or cancelled, expired, shutting down); False when it
        is not queued. The requests behind it moved up one: their streaming clients are told."""
        request = ticket.request
        flow = self._queues.flow_of(request.request_id)
        if self._queues.remove(request.request_id, dispatched=dispatched) is None:
            return False
        del self._tickets[request.request_id]
        if not dispatched:
            self.end_users.left(request)
        self._show_depth(request.priority_class, self._queues.band(request.priority_class).size)
        if flow:
            self._positions.moved(flow)
        return True

    def moved(self, flow: Flow) -> None:
        """The positions in `flow` changed (a request was put back at its head)."""
        self._positions.moved(flow)

    def position(self, ticket: Ticket) -> int:
        """1-based rank of the ticket's request in its user's queue by the ordering policy; 0 once it left."""
        flow = self._queues.flow_of(ticket.request.request_id)
        return 0 if flow is None else flow.position(ticket.request)

    def ahead(self, ticket: Ticket, position: int) -> int:
        """About how many requests go before the ticket's, at `position` in its (end) user's queue: every
        request of the better bands, and each backlogged user of its band served in turn (and in its user's
        turns, each of that user's backlogged end users)."""
        request = ticket.request
        band = self._queues.band(request.priority_class)
        rank = band.priority_class.rank
        higher = sum(b.size for b in self._queues.bands if b.priority_class.rank < rank)
        flow = band.flows.get(request.user)
        end_users = 1 if flow is None else max(1, len(flow.end_user_flows))
        return higher + position * max(1, len(band.flows)) * end_users - 1

    # -- read-only views for dispatch: the bands, a user's next request ---------------------------------------
    @property
    def bands(self) -> Sequence[Band]:
        """Every band, best rank first."""
        return self._queues.bands

    def band(self, priority_class: str) -> Band:
        return self._queues.band(priority_class)

    def has_band(self, priority_class: str) -> bool:
        return self._queues.has_band(priority_class)

    def use_classes(self, classes: Sequence[PriorityClassConfig]) -> None:
        """A reload's classes (`ModelQueues.use_classes`): kept bands take new settings, new ones start empty."""
        self._queues.use_classes(classes)

    def drop_band(self, priority_class: str) -> None:
        """Remove the empty band of a class that left the configuration."""
        self._queues.drop_band(priority_class)

    def backlogged_bands(self) -> list[Band]:
        """Non-empty bands, best rank first."""
        return self._queues.backlogged_bands()

    def head(self, band: Band, user: str) -> Ticket | None:
        """The ticket of `user`'s next request in `band` by the ordering policy; None when it has none."""
        flow = band.flows.get(user)
        return None if flow is None else self._tickets[flow.head().request_id]

    def user_depth(self, user: str) -> int:
        """Requests this user has queued for the model, all bands together."""
        return self._queues.user_depth(user)

    def users_in(self, priority_class: str) -> int:
        """How many users have requests queued in the class's band."""
        return self._queues.users_in(priority_class)

    async def notify_positions(self, interval: float) -> None:
        """Nudge the streaming clients whose queue position changed, at most once per `interval`."""
        await self._positions.run(interval)

    def notify_now(self) -> int:
        """Nudge the watching clients of every flow that moved since the last time; returns how many."""
        return self._positions.notify()

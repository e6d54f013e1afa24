"""Per-model queues: priority bands, and inside each band one FIFO flow per user.

Only this module mutates queues. Policies receive the read-only `FlowView` / `BandView` protocols, so
they can look but not reorder or drop anything.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from scheduler_svc.config_schema import PriorityClassConfig
from scheduler_svc.request import QueuedRequest, RequestView


class FlowView(Protocol):
    """One user's queued requests within one band, oldest first (read-only)."""

    @property
    def user(self) -> str: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[RequestView]: ...
    def head(self) -> RequestView: ...


class Flow:
    """A user's FIFO of requests in one band. O(1) push, pop and removal of any request."""

    __slots__ = ("_items", "_next_seq", "priority_class", "user")

    def __init__(self, user: str, priority_class: str) -> None:
        self.user = user
        self.priority_class = priority_class
        self._items: OrderedDict[str, QueuedRequest] = OrderedDict()
        self._next_seq = 0

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[RequestView]:
        return iter(self._items.values())

    def head(self) -> QueuedRequest:
        """The oldest queued request."""
        return next(iter(self._items.values()))

    def push(self, request: QueuedRequest) -> None:
        request.seq = self._next_seq
        self._next_seq += 1
        self._items[request.request_id] = request

    def push_front(self, request: QueuedRequest) -> None:
        """Put a request back ahead of the others (it was sent and came back before its first token)."""
        if not self._items:
            self.push(request)
            return
        request.seq = self.head().seq - 1
        self._items[request.request_id] = request
        self._items.move_to_end(request.request_id, last=False)

    def remove(self, request_id: str) -> QueuedRequest | None:
        return self._items.pop(request_id, None)

    def position(self, request: QueuedRequest) -> int:
        """1-based position; an upper bound when requests ahead of it were removed out of order."""
        if not self._items:
            return 0
        return request.seq - self.head().seq + 1


class Band:
    """The queued requests of one priority class: backlogged flows in the order they became backlogged."""

    __slots__ = ("flows", "priority_class", "size")

    def __init__(self, priority_class: PriorityClassConfig) -> None:
        self.priority_class = priority_class
        self.flows: dict[str, Flow] = {}
        self.size = 0

    @property
    def flow_views(self) -> Mapping[str, FlowView]:
        """Backlogged flows by user, read-only for policies."""
        return self.flows


class ModelQueues:
    """All queued requests of one model."""

    def __init__(self, classes: Sequence[PriorityClassConfig]) -> None:
        ordered = sorted(classes, key=lambda c: c.rank)
        self.bands: list[Band] = [Band(c) for c in ordered]
        self._band_by_class = {b.priority_class.name: b for b in self.bands}
        self._flow_of: dict[str, Flow] = {}
        self._user_depth: dict[str, int] = {}
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def band(self, priority_class: str) -> Band:
        return self._band_by_class[priority_class]

    def push(self, request: QueuedRequest, *, front: bool = False) -> tuple[Flow, bool]:
        """Queue `request` (at the head of its flow with `front`); returns its flow and whether that flow
        just became backlogged."""
        band = self._band_by_class[request.priority_class]
        flow = band.flows.get(request.user)
        newly_backlogged = flow is None
        if flow is None:
            flow = band.flows[request.user] = Flow(request.user, request.priority_class)
        if front:
            flow.push_front(request)
        else:
            flow.push(request)
        band.size += 1
        self.size += 1
        self._flow_of[request.request_id] = flow
        self._user_depth[request.user] = self._user_depth.get(request.user, 0) + 1
        return flow, newly_backlogged

    def remove(self, request_id: str) -> QueuedRequest | None:
        """Take a request out wherever it is; None if it is not queued (already dispatched or removed)."""
        flow = self._flow_of.pop(request_id, None)
        if flow is None:
            return None
        request = flow.remove(request_id)
        assert request is not None
        band = self._band_by_class[flow.priority_class]
        band.size -= 1
        self.size -= 1
        if not flow:
            del band.flows[flow.user]
        depth = self._user_depth[request.user] - 1
        if depth:
            self._user_depth[request.user] = depth
        else:
            del self._user_depth[request.user]
        return request

    def flow_of(self, request_id: str) -> Flow | None:
        return self._flow_of.get(request_id)

    def user_depth(self, user: str) -> int:
        """Requests this user has queued for the model, all bands together."""
        return self._user_depth.get(user, 0)

    def backlogged_bands(self) -> Iterator[Band]:
        """Non-empty bands, best (lowest rank) first."""
        return (b for b in self.bands if b.size)

    def depth_by_band_and_user(self) -> dict[str, dict[str, int]]:
        """For introspection: class -> user -> queued requests."""
        return {b.priority_class.name: {u: len(f) for u, f in b.flows.items()} for b in self.bands}

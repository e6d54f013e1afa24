"""Per-model queues: priority bands, inside each band one flow (queue) per user, and inside a flow one queue
per end user the user named (a single one for a user that names none).

Only this module mutates queues. Policies receive them as the read-only views of
`scheduler_svc.policies.interfaces`, so they can look but not reorder or drop anything.

A flow's storage does not decide its order: the ordering policy's key does (`OrderKey`). A flow keeps its
requests sorted by that key, so its head is the request that goes next, a request's position is its
rank in that order, and nothing here assumes the head is the oldest (a band's starvation age is read from
a separate record of admissions).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping, Sequence

from sortedcontainers import SortedList

from scheduler_svc.config import PriorityClassConfig
from scheduler_svc.core.request import QueuedRequest

OrderKey = tuple[float, ...]
"""A request's place in its user's queue by the ordering policy: smaller goes first, equal keys go in
arrival order. It must not change while the request is queued."""

OrderKeyFn = Callable[[QueuedRequest], OrderKey]


def arrival_order(request: QueuedRequest) -> OrderKey:
    """The empty key: arrival order alone (first come, first served)."""
    return ()


# (front, policy key, stamp, request): `front` is 0, or -n for the n-th request put back at the front of
# the flow; `stamp` counts the flow's pushes and is unique, so comparisons never reach the request.
_Entry = tuple[int, OrderKey, int, QueuedRequest]

EndUserChoice = Callable[["Flow"], str]
"""Which end user of a flow that holds several goes next (dispatch's nested fairness, `dispatch.end_users`):
asked with the flow once its previous choice is spent, it names one of `Flow.end_user_flows`."""


class EndUserFlow:
    """One end user's queued requests inside its tenant's flow, in the flow's order (the view the nested
    fairness policy reads, as a band's policy reads the tenants' flows). `user` is the end user's id, empty
    for the tenant's requests that name none."""

    __slots__ = ("_order", "user")

    def __init__(self, end_user: str) -> None:
        self.user = end_user
        self._order = SortedList()

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[QueuedRequest]:
        return (entry[3] for entry in self._order)

    def head(self) -> QueuedRequest:
        entry: _Entry = self._order[0]
        return entry[3]

    def last(self) -> QueuedRequest:
        entry: _Entry = self._order[-1]
        return entry[3]

    def add(self, entry: _Entry) -> None:
        self._order.add(entry)

    def discard(self, entry: _Entry) -> None:
        self._order.remove(entry)

    def rank(self, entry: _Entry) -> int:
        """0-based place of a queued entry in this end user's order."""
        index: int = self._order.index(entry)
        return index


class Flow:
    """A user's (a tenant's) queued requests in one band, kept in the ordering policy's order within each of
    its end users.

    Entries sort by (front, key, stamp): `front` puts a request that came back from a failed dispatch ahead
    of everything (the latest such first), `key` is the ordering policy's, `stamp` keeps arrival order
    among equal keys. Push, removal of any request and position are O(log n) (a `SortedList`, which also
    keeps ranks); head and the oldest admission are O(1): admissions sit in a heap whose stale records are
    popped while they are on top, and which is rebuilt once they outnumber live ones, so it stays O(n) and
    each removal costs O(log n) amortised.

    End users: the requests are kept in one `EndUserFlow` per end user the tenant named (its requests that
    name none in the one of the empty id). With one of them, which is every tenant that names no end user,
    the flow is that one queue. With several, the head is the head of the end user that `choose` (the
    nested fairness policy) picks, and the pick stands until one of the flow's requests is dispatched or one
    is put back at the front: a choice looked at and not taken (a candidate the backend policy passed over,
    a head that expired) is made once. A request's position is its rank among its end user's requests.
    """

    __slots__ = (
        "_admissions",
        "_choose",
        "_entries",
        "_fronts",
        "_key",
        "_next",
        "_stamp",
        "_subflows",
        "priority_class",
        "user",
    )

    def __init__(
        self, user: str, priority_class: str, key: OrderKeyFn = arrival_order, choose: EndUserChoice | None = None
    ) -> None:
        self.user = user
        self.priority_class = priority_class
        self._key = key
        self._choose = choose
        self._subflows: dict[str, EndUserFlow] = {}  # end user -> its queue, in the order they became backlogged
        self._next: str | None = None  # the end user whose head goes next, while several are backlogged
        self._entries: dict[str, _Entry] = {}
        self._admissions: list[tuple[float, int, str]] = []  # (admitted_at, stamp, request_id), lazily cleaned
        self._stamp = 0
        self._fronts = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[QueuedRequest]:
        for subflow in list(self._subflows.values()):
            yield from subflow

    @property
    def end_user_flows(self) -> Mapping[str, EndUserFlow]:
        """The backlogged end users' queues by end user id, in the order they became backlogged."""
        return self._subflows

    def head(self) -> QueuedRequest:
        """The request that goes next: by the ordering policy, of the end user chosen to go next."""
        subflows = self._subflows
        if len(subflows) == 1:
            for only in subflows.values():
                return only.head()
        return subflows[self._next_end_user()].head()

    def _next_end_user(self) -> str:
        chosen = self._next
        if chosen is None or chosen not in self._subflows:
            chosen = self._choose(self) if self._choose is not None else next(iter(self._subflows))
            self._next = chosen
        return chosen

    def push(self, request: QueuedRequest) -> None:
        """Queue `request` where the ordering policy puts it."""
        self._add((0, self._key(request), self._stamp, request))

    def push_front(self, request: QueuedRequest) -> None:
        """Put a request back ahead of all others of its end user, whatever the ordering policy (it was sent
        and came back before its first token: it goes first again), and choose the next end user again."""
        self._fronts += 1
        self._next = None
        self._add((-self._fronts, (), self._stamp, request))

    def _add(self, entry: _Entry) -> None:
        request = entry[3]
        self._stamp += 1
        subflow = self._subflows.get(request.end_user)
        if subflow is None:
            subflow = self._subflows[request.end_user] = EndUserFlow(request.end_user)
        subflow.add(entry)
        self._entries[request.request_id] = entry
        heapq.heappush(self._admissions, (request.admitted_at, entry[2], request.request_id))

    def remove(self, request_id: str, *, dispatched: bool = False) -> QueuedRequest | None:
        """Take a request out; `dispatched`: it goes to an engine, which spends the choice of the end user
        that goes next (a cancelled or expired request leaves its end user's turn standing)."""
        entry = self._entries.pop(request_id, None)
        if entry is None:
            return None
        end_user = entry[3].end_user
        subflow = self._subflows[end_user]
        subflow.discard(entry)
        if not subflow:
            del self._subflows[end_user]
        if dispatched:
            self._next = None
        admissions = self._admissions
        while admissions and not self._live(admissions[0]):  # under arrival order: the one just removed
            heapq.heappop(admissions)
        if len(admissions) > 2 * len(self._entries) + 16:  # removals from the middle left too many behind
            self._admissions = [(e[3].admitted_at, e[2], e[3].request_id) for e in self._entries.values()]
            heapq.heapify(self._admissions)
        return entry[3]

    def _live(self, admission: tuple[float, int, str]) -> bool:
        """Whether a record of the admissions heap is still a queued request's (not removed or re-pushed)."""
        entry = self._entries.get(admission[2])
        return entry is not None and entry[2] == admission[1]

    def position(self, request: QueuedRequest) -> int:
        """1-based rank of `request` among its end user's requests by the ordering policy (1: it goes next
        for its end user); 0 if not queued here."""
        entry = self._entries.get(request.request_id)
        if entry is None:
            return 0
        return self._subflows[request.end_user].rank(entry) + 1

    def is_last(self, request: QueuedRequest) -> bool:
        """Whether `request` is behind every other queued request of its end user (pushing it moved nobody)."""
        return self._subflows[request.end_user].last() is request

    def oldest_admission(self) -> float:
        """When the longest-waiting request of the flow was admitted, whatever the order (flow non-empty)."""
        return self._admissions[0][0]  # stale records on top are dropped as requests leave


class Band:
    """The queued requests of one priority class: backlogged flows in the order they became backlogged.

    `size`, `prompt_tokens` and `max_output_tokens` are running totals over the queued requests (kept by
    `ModelQueues` as requests come and go), so reading what is queued costs nothing per request. The band's
    oldest admission is read from a heap of its flows by their own oldest (an entry per change, stale ones
    dropped when on top and the heap rebuilt once they outnumber the flows), so it costs O(log n) amortised
    in the users queued, not a look at every flow.
    """

    __slots__ = ("_oldest", "_stamp", "flows", "max_output_tokens", "priority_class", "prompt_tokens", "size")

    def __init__(self, priority_class: PriorityClassConfig) -> None:
        self.priority_class = priority_class
        self.flows: dict[str, Flow] = {}
        self.size = 0
        self.prompt_tokens = 0  # the requests' prompt_tokens_estimate, summed
        self.max_output_tokens = 0  # their max_tokens, summed: the most they may generate
        self._oldest: list[tuple[float, int, Flow]] = []  # (a flow's oldest admission, stamp, flow), lazily cleaned
        self._stamp = 0

    @property
    def flow_views(self) -> Mapping[str, Flow]:
        """Backlogged flows by user, in the order they became backlogged (policies see them read-only)."""
        return self.flows

    def oldest_admission(self) -> float:
        """When the band's longest-waiting request was admitted (band non-empty): its starvation age is
        measured from here. Whatever the ordering: starvation is about how long the band's work has waited,
        and under an order other than arrival a flow's head may be its youngest request, so reading heads
        would let an old request hide behind fresher ones that keep overtaking it."""
        heap = self._oldest
        while not self._current(heap[0]):
            heapq.heappop(heap)
        return heap[0][0]

    def note_oldest(self, flow: Flow) -> None:
        """`flow`'s oldest admission may have changed (a request came or went; the flow is non-empty)."""
        self._stamp += 1
        heapq.heappush(self._oldest, (flow.oldest_admission(), self._stamp, flow))
        if len(self._oldest) > 2 * len(self.flows) + 16:
            self._oldest = [entry for entry in self._oldest if self._current(entry)]
            heapq.heapify(self._oldest)

    def _current(self, entry: tuple[float, int, Flow]) -> bool:
        """Whether a heap entry still tells its flow's oldest admission (the flow is queued and unchanged)."""
        flow = entry[2]
        return self.flows.get(flow.user) is flow and flow.oldest_admission() == entry[0]


class ModelQueues:
    """All queued requests of one model; each flow ordered by `order_key` (the ordering policy's key)."""

    def __init__(
        self,
        classes: Sequence[PriorityClassConfig],
        order_key: OrderKeyFn = arrival_order,
        choose_end_user: EndUserChoice | None = None,
    ) -> None:
        self._order_key = order_key
        self._choose_end_user = choose_end_user
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

    def has_band(self, priority_class: str) -> bool:
        return priority_class in self._band_by_class

    def use_classes(self, classes: Sequence[PriorityClassConfig]) -> None:
        """The classes of a reloaded configuration: a kept band takes its class's new settings (its rank may
        move it among the bands), a new class gets an empty band; a band whose class is gone stays, with its
        last settings, until `drop_band`. No queued request moves within its flow."""
        for cls in classes:
            band = self._band_by_class.get(cls.name)
            if band is None:
                self._band_by_class[cls.name] = band = Band(cls)
                self.bands.append(band)
            band.priority_class = cls
        self.bands.sort(key=lambda b: b.priority_class.rank)  # in place: views of the list see the new order

    def drop_band(self, priority_class: str) -> None:
        """Remove an empty band (its class left the configuration)."""
        band = self._band_by_class.pop(priority_class)
        assert not band.size, f"band {priority_class} still holds {band.size} requests"
        self.bands.remove(band)

    def push(self, request: QueuedRequest, *, front: bool = False) -> tuple[Flow, bool]:
        """Queue `request` where the ordering puts it (at the head of its flow with `front`); returns its
        flow and whether that flow just became backlogged."""
        band = self._band_by_class[request.priority_class]
        flow = band.flows.get(request.user)
        newly_backlogged = flow is None
        if flow is None:
            flow = band.flows[request.user] = Flow(
                request.user, request.priority_class, self._order_key, self._choose_end_user
            )
        oldest = None if newly_backlogged else flow.oldest_admission()
        if front:
            flow.push_front(request)
        else:
            flow.push(request)
        if flow.oldest_admission() != oldest:
            band.note_oldest(flow)
        band.size += 1
        band.prompt_tokens += request.prompt_tokens_estimate
        band.max_output_tokens += request.max_tokens
        self.size += 1
        self._flow_of[request.request_id] = flow
        self._user_depth[request.user] = self._user_depth.get(request.user, 0) + 1
        return flow, newly_backlogged

    def remove(self, request_id: str, *, dispatched: bool = False) -> QueuedRequest | None:
        """Take a request out wherever it is (`dispatched`: to an engine, see `Flow.remove`); None if it is
        not queued (already dispatched or removed)."""
        flow = self._flow_of.pop(request_id, None)
        if flow is None:
            return None
        oldest = flow.oldest_admission()
        request = flow.remove(request_id, dispatched=dispatched)
        assert request is not None
        band = self._band_by_class[flow.priority_class]
        if not flow:
            del band.flows[flow.user]
        elif flow.oldest_admission() != oldest:
            band.note_oldest(flow)
        band.size -= 1
        band.prompt_tokens -= request.prompt_tokens_estimate
        band.max_output_tokens -= request.max_tokens
        self.size -= 1
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

    def users_in(self, priority_class: str) -> int:
        """Users with requests queued in the class's band."""
        return len(self._band_by_class[priority_class].flows)

    def backlogged_bands(self) -> list[Band]:
        """Non-empty bands, best (lowest rank) first."""
        return [b for b in self.bands if b.size]

"""The position notifier: tells streaming clients that their place in their user's queue changed.

Event-driven so that idle queued streams cost nothing: a timer per queued stream cost ~40 us a second
each, most of a core at 20,000 queued. Only flows whose order changed (a request left, or one was put
ahead of others) are visited, at most once per interval.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from scheduler_svc.core.queues import Flow


class Watcher(Protocol):
    """A queued request's waiter (a `Ticket`): whether a streaming client watches, and how to wake it."""

    @property
    def watches_position(self) -> bool: ...

    def nudge(self) -> None: ...


class PositionNotifier:
    """Collects the flows whose positions moved and nudges their watching tickets."""

    def __init__(self, queued: Mapping[str, Watcher]) -> None:
        self._queued = queued  # request id -> ticket, for every queued request (the dispatcher's map)
        self._moved: set[Flow] = set()  # flows whose positions changed since streaming clients were last told
        self._flows_moved = asyncio.Event()

    def moved(self, flow: Flow) -> None:
        """The positions in `flow` changed."""
        self._moved.add(flow)
        self._flows_moved.set()

    def notify(self) -> int:
        """Nudge every watching ticket of the flows moved since the last call; returns how many."""
        self._flows_moved.clear()
        moved, self._moved = self._moved, set()
        nudged = 0
        for flow in moved:
            for request in flow:
                ticket = self._queued.get(request.request_id)
                if ticket is not None and ticket.watches_position:
                    ticket.nudge()
                    nudged += 1
        return nudged

    async def run(self, interval: float) -> None:
        """Nudge the streaming clients whose queue position changed, at most once per `interval`."""
        while True:
            await self._flows_moved.wait()
            self.notify()
            await asyncio.sleep(interval)  # a rate limit, not a synchronisation

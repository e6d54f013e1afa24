"""Shutdown of one model's dispatch: stop sending, end what waits, wait for what runs, cut what is left.

Once stopping, no request is dispatched nor queued again after a failover; every queued request ends at once
with UNAVAILABLE (`ShuttingDown`) so its client can retry elsewhere. Running requests may finish; after the
grace the scheduler cuts them, which ends them with the same status.
"""

from __future__ import annotations

import asyncio

from scheduler_svc.core.errors import ShuttingDown
from scheduler_svc.core.ticket import Outcome
from scheduler_svc.dispatch.queue_book import QueueBook
from scheduler_svc.dispatch.run_ledger import RunLedger


class Shutdown:
    """Whether one model is stopping, and the steps of its drain."""

    def __init__(self, book: QueueBook, ledger: RunLedger) -> None:
        self._book = book
        self._ledger = ledger
        self.stopping = False
        self._settled = asyncio.Event()  # set whenever a request reaches its outcome

    def reject_all_queued(self, reason: str) -> int:
        """Stop, and end every queued request with UNAVAILABLE; returns how many."""
        self.stopping = True
        tickets = self._book.tickets()
        for ticket in tickets:
            self._book.take(ticket)
            ticket.end_in_queue(Outcome.REJECTED, ShuttingDown(reason))
        return len(tickets)

    def cut_running(self, reason: str) -> int:
        """Cut every running generation (the grace is over); returns how many were cut."""
        return sum(ticket.cut(ShuttingDown(reason)) for ticket in self._ledger.tickets())

    def settled(self) -> None:
        """A request reached its outcome."""
        self._settled.set()

    async def wait_settled(self) -> None:
        """Wait until some request reaches its outcome."""
        self._settled.clear()
        await self._settled.wait()

"""Queued streaming clients hear about position changes from one per-model pass, not from a timer each."""

from __future__ import annotations

import asyncio

from tests.unit.dispatch_harness import Harness


async def test_only_clients_whose_queue_moved_are_woken() -> None:
    h = Harness(cap=1)
    a1, a2, a3 = (h.submit("a") for _ in range(3))
    b1, b2 = (h.submit("b") for _ in range(2))
    for ticket in (a1, a2, a3, b1, b2):
        ticket.watches_position = True
    updates = asyncio.create_task(h.dispatcher.notify_positions(0.0))
    try:
        assert h.dispatch() == [a1]  # a's queue moves up; b's does not
        assert await asyncio.wait_for(a2.wait_dispatched(None), 5) is False  # woken, still queued
        assert a2.position() == 1
        # one pass nudges every moved flow at once: by now a3 was nudged and b's clients were not
        assert a3.woken
        assert not b1.woken and not b2.woken
    finally:
        updates.cancel()


async def test_a_nudge_wakes_the_waiter_once_and_a_dispatch_still_gets_through() -> None:
    h = Harness(cap=1)
    first, second = h.submit("a"), h.submit("a")
    second.nudge()
    assert await second.wait_dispatched(None) is False
    assert not second.woken  # re-armed: the next wait blocks until the next change
    waiting = asyncio.create_task(second.wait_dispatched(None))
    assert h.dispatch() == [first]
    first.close()
    assert h.dispatch() == [second]
    assert await asyncio.wait_for(waiting, 5) is True

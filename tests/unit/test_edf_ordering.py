"""Earliest deadline first through the dispatcher: order, positions, nudges, failover, starvation age."""

from __future__ import annotations

import asyncio

from backends.errors import BackendUnavailable
from tests.unit.dispatch_harness import Harness
from tests.unit.test_policies_in_depth import keep_backlogged


def test_a_users_requests_go_by_deadline_those_without_one_last_ties_by_arrival() -> None:
    h = Harness({"ordering": "edf"}, cap=1)
    tickets = [h.submit("a", timeout=t) for t in (None, 30.0, 10.0, 20.0, 10.0, None)]
    assert [t.position() for t in tickets] == [5, 4, 1, 3, 2, 6]
    order = []
    for _ in tickets:
        (sent,) = h.dispatch()
        order.append(tickets.index(sent))
        sent.close()
    assert order == [2, 4, 3, 1, 0, 5]


def test_fcfs_ignores_deadlines() -> None:
    h = Harness({"ordering": "fcfs"}, cap=1)
    tickets = [h.submit("a", timeout=t) for t in (None, 30.0, 10.0)]
    assert [t.position() for t in tickets] == [1, 2, 3]


def test_the_class_ttl_is_the_deadline_when_the_call_sets_none() -> None:
    classes = [{"name": "interactive", "rank": 0, "queue_ttl_seconds": 15.0}]
    h = Harness({"ordering": "edf", "classes": classes, "default_class": "interactive"}, cap=1)
    ttl_only = h.submit("a")  # expires at 15
    h.clock.advance(1.0)
    later_call = h.submit("a", timeout=20.0)  # the TTL, at 16, comes first: its deadline is 16
    short_call = h.submit("a", timeout=5.0)  # 6
    assert [t.position() for t in (ttl_only, later_call, short_call)] == [2, 3, 1]


async def test_a_newcomer_with_a_closer_deadline_moves_the_others_back_and_their_clients_hear_it() -> None:
    h = Harness({"ordering": "edf"}, cap=1)
    first, second = h.submit("a", timeout=50.0), h.submit("a", timeout=60.0)
    other = h.submit("b", timeout=1.0)
    for ticket in (first, second, other):
        ticket.watches_position = True
    updates = asyncio.create_task(h.dispatcher.notify_positions(0.0))
    try:
        urgent = h.submit("a", timeout=5.0)
        assert await asyncio.wait_for(first.wait_dispatched(None), 5) is False  # woken, still queued
        assert (urgent.position(), first.position(), second.position()) == (1, 2, 3)
        assert second.woken and not other.woken  # b's queue did not move
    finally:
        updates.cancel()


def test_a_failed_over_request_goes_first_again_under_edf() -> None:
    h = Harness({"ordering": "edf"}, cap=1)
    far = h.submit("a", timeout=100.0)
    (sent,) = h.dispatch()
    assert sent is far
    near = h.submit("a", timeout=10.0)  # arrived while `far` was at the engine, closer deadline
    assert h.events.fail_over(far, BackendUnavailable("connection refused"))
    assert (far.position(), near.position()) == (1, 2)
    h.clock.advance(h.config.models[0].failover_cooldown_seconds)  # the only backend cooled down
    assert h.dispatch() == [far]


def test_a_band_starves_by_its_oldest_request_even_when_a_younger_one_is_next() -> None:
    """Under edf the head of a flow can be its youngest request; the band's age must still be its oldest
    request's, or fresh requests with deadlines would keep the band from ever counting as starving."""
    classes = [
        {"name": "interactive", "rank": 0},
        {"name": "batch", "rank": 1, "starvation_after_seconds": 5.0},
    ]
    h = Harness({"ordering": "edf", "classes": classes, "default_class": "interactive"}, cap=1)
    start = h.clock.now()
    old = h.submit("bulk", priority_class="batch")  # no deadline: last in its flow under edf
    young = None
    while not any(t.request.priority_class == "batch" for t in h.dispatch_log):
        if young is None and h.clock.now() - start >= 4.0:
            young = h.submit("bulk", priority_class="batch", timeout=1000.0)  # goes ahead of `old`
        keep_backlogged(h, {"alice": 10}, depth=2)
        h.dispatch()
        h.step()
    promoted = next(t for t in h.dispatch_log if t.request.priority_class == "batch")
    assert promoted is young  # the order picks which request goes: the one with a deadline
    assert h.clock.now() - start < 5.2  # ...and the age came from `old`, admitted at 0 (`young` would give 9)
    assert old.position() == 1

"""The dispatcher's named parts one at a time (`dispatch.dispatcher` wires them): the queue book, the run
ledger, the decision pass, the loop, the request events, the shutdown and the watchdog's look. Fake clock,
plain objects and fake backends; no sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from backends.base import SamplingParams
from backends.errors import BackendRejectedRequest, BackendUnavailable
from backends.fake import FakeBackend
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.config import PriorityClassConfig
from scheduler_svc.core.clock import FakeClock
from scheduler_svc.core.errors import ShuttingDown
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.core.ticket import Outcome, Ticket, TicketState
from scheduler_svc.dispatch.activity import ClassActivity
from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.dispatch.health import InternalErrors, LoopHealth, ServiceHealth, StallWatch
from scheduler_svc.dispatch.load import LoadEstimator
from scheduler_svc.dispatch.loop import DispatchLoop
from scheduler_svc.dispatch.metrics import SchedulerMetrics, backend_series
from scheduler_svc.dispatch.queue_book import QueueBook
from scheduler_svc.dispatch.run_ledger import RunLedger
from scheduler_svc.dispatch.shutdown import Shutdown
from scheduler_svc.policies.ordering import EdfOrdering
from tests.unit.dispatch_harness import CapGate, Harness, never_generates

CLASSES = [PriorityClassConfig("interactive", rank=0), PriorityClassConfig("batch", rank=1)]


class Host:
    """A ticket's host that only keeps time and records what the ticket says."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.said: list[tuple[str, str]] = []

    def now(self) -> float:
        return self.clock.now()

    def position(self, ticket: Ticket) -> int:
        return 0

    def expire(self, ticket: Ticket) -> None:
        self.said.append(("expire", ticket.request.request_id))

    def release(self, ticket: Ticket, outcome: Outcome) -> None:
        self.said.append(("release", ticket.request.request_id))

    def settled(self, ticket: Ticket) -> None:
        self.said.append(("settled", ticket.request.request_id))


def ticket(rid: str, user: str = "u", cls: str = "interactive", host: Host | None = None, **fields: Any) -> Ticket:
    request = QueuedRequest(
        request_id=rid,
        model="m",
        user=user,
        priority_class=cls,
        prompt="p",
        messages=None,
        params=SamplingParams(),
        admitted_at=fields.pop("admitted_at", 0.0),
        **fields,
    )
    return Ticket(request, host or Host(FakeClock()))


def handle(name: str = "b0") -> BackendHandle:
    config = config_from_dict({"models": [{"name": "m", "backends": [{"name": name}]}]})
    return BackendHandle(
        config.models[0].backends[0], FakeBackend(never_generates, name=name), CapGate(4), LoadEstimator()
    )


# -- the queue book ---------------------------------------------------------------------------------------------
def test_the_queue_book_holds_each_queued_ticket_shows_depth_and_tells_who_moved() -> None:
    depths: list[tuple[str, int]] = []
    book = QueueBook(CLASSES, EdfOrdering().key, lambda cls, size: depths.append((cls, size)))
    late, soon = ticket("late", deadline=50.0), ticket("soon", deadline=10.0)
    late.watches_position = soon.watches_position = True
    assert book.put(late)[1] is True  # u just became backlogged
    _, newly = book.put(soon)  # the ordering puts it ahead: `late` moved back one
    assert not newly
    assert [t.request.request_id if t else None for t in map(book.ticket, ("late", "soon"))] == ["late", "soon"]
    assert (book.position(soon), book.position(late)) == (1, 2)
    assert book.notify_now() == 2  # u's flow moved: both its watching clients re-read their positions
    assert book.notify_now() == 0  # nothing moved since
    assert book.head(book.band("interactive"), "u") is soon and book.head(book.band("interactive"), "v") is None
    assert book.take(soon) and not book.take(soon)
    assert book.position(soon) == 0 and book.position(late) == 1 and book.notify_now() == 1  # `late` moved up
    assert depths == [("interactive", 1), ("interactive", 2), ("interactive", 1)]
    assert len(book) == 1 and book.user_depth("u") == 1 and book.users_in("interactive") == 1


def test_the_queue_book_counts_better_bands_and_the_bands_users_ahead() -> None:
    book = QueueBook(CLASSES, EdfOrdering().key)
    for i in range(3):
        book.put(ticket(f"i{i}", user=f"u{i}"))
    mine = ticket("b1", user="x", cls="batch")
    book.put(ticket("b0", user="y", cls="batch"))
    book.put(mine)
    # three interactive requests go first, then x and y take turns: x's first request is the second of those
    assert book.ahead(mine, position=1) == 3 + 1 * 2 - 1
    assert [b.priority_class.name for b in book.backlogged_bands()] == ["interactive", "batch"]


# -- the run ledger ---------------------------------------------------------------------------------------------
def test_the_run_ledger_keeps_each_running_ticket_with_its_backend_its_class_and_the_gauges() -> None:
    metrics, b0, b1 = SchedulerMetrics(), handle("b0"), handle("b1")
    series = {h.name: backend_series(metrics, "m", h.name) for h in (b0, b1)}
    activity = ClassActivity(CLASSES)
    ledger = RunLedger([b0, b1], activity, series)
    sent = ticket("r")
    b1.estimator.dispatched("r", None, "u")
    sent.assign(b1, now=1.0)
    ledger.start(sent, b1, now=1.0)
    gauge = metrics.registry.get_sample_value
    assert ledger.ticket("r") is sent and ledger.backend_of(sent) is b1 and len(ledger) == 1
    assert (
        ledger.in_flight().counts() == {"b0": 0, "b1": 1}
        and gauge("llmsched_backend_in_flight", {"model": "m", "backend": "b1"}) == 1
    )
    assert activity.better_active(PriorityClassConfig("batch", rank=1, max_engine_running_when_contended=1), 1.0)
    assert ledger.end(sent, now=2.0) is b1
    assert ledger.ticket("r") is None and b1.estimator.in_flight == 0
    assert gauge("llmsched_backend_in_flight", {"model": "m", "backend": "b1"}) == 0
    assert ledger.backend("b0") is b0 and ledger.backend("nope") is None


# -- the loop ------------------------------------------------------------------------------------------------------
async def test_the_loop_passes_once_per_wake_and_chooses_again_when_a_held_choice_is_due() -> None:
    clock, passes = FakeClock(), []
    due: list[float | None] = [clock.now(), None]  # the first pass holds a choice until now: pass again at once
    health = LoopHealth("dispatch:m", ServiceHealth(), max_failed_passes=3, max_stall_seconds=0.0)
    errors = InternalErrors(lambda component: None)
    loop = DispatchLoop(lambda: passes.append(len(passes)), lambda: due.pop(0), clock, errors, health, "m")
    loop.wake()
    loop.wake()  # merged with the first
    assert loop.take_wake() and not loop.take_wake()  # a hand-stepped pass consumes the wake-up
    loop.wake()
    task = asyncio.create_task(loop.run())
    for _ in range(5):  # the pass, then the timer's zero delay, then the second pass
        await asyncio.sleep(0)
    task.cancel()
    assert passes == [0, 1] and due == []


async def test_a_pass_that_raises_is_counted_and_fails_the_loops_health() -> None:
    clock, service = FakeClock(), ServiceHealth()
    counted: list[str] = []
    health = LoopHealth("dispatch:m", service, max_failed_passes=1, max_stall_seconds=0.0)

    def broken() -> int:
        raise RuntimeError("a policy bug")

    loop = DispatchLoop(broken, lambda: None, clock, InternalErrors(counted.append), health, "m")
    loop.wake()
    task = asyncio.create_task(loop.run())
    await asyncio.sleep(0)
    loop.wake()  # the loop goes on with the next event
    await asyncio.sleep(0)
    task.cancel()
    assert counted == ["dispatch", "dispatch"] and not service.serving


# -- shutdown and the watchdog's look --------------------------------------------------------------------------
async def test_shutdown_stops_ends_what_waits_cuts_what_runs_and_hears_each_outcome() -> None:
    clock = FakeClock()
    host = Host(clock)
    book = QueueBook(CLASSES, EdfOrdering().key)
    ledger = RunLedger([handle()], ClassActivity(CLASSES), {"b0": backend_series(SchedulerMetrics(), "m", "b0")})
    shutdown = Shutdown(book, ledger)
    waiting, running = ticket("w", host=host), ticket("r", host=host)
    book.put(waiting)
    running.assign(handle(), now=0.0)
    ledger.start(running, handle(), now=0.0)
    settled = asyncio.create_task(shutdown.wait_settled())
    await asyncio.sleep(0)  # it waits from now on
    assert shutdown.reject_all_queued("stopping") == 1 and shutdown.stopping
    assert waiting.outcome is Outcome.REJECTED and len(book) == 0
    with pytest.raises(ShuttingDown):
        await waiting.wait_dispatched(None)
    assert shutdown.cut_running("cut") == 1 and isinstance(running.cut_reason, ShuttingDown)
    assert not settled.done()
    shutdown.settled()
    await asyncio.wait_for(settled, 1)


def test_the_watchdog_flags_a_stall_only_while_work_could_go_and_nothing_went() -> None:
    service = ServiceHealth()
    watch = StallWatch(LoopHealth("dispatch:m", service, max_failed_passes=3, max_stall_seconds=30.0))
    watch.look(0.0, could_dispatch=True)
    watch.look(31.0, could_dispatch=True)
    assert "dispatch:m:stall" in service.problems
    watch.count(1)
    watch.look(32.0, could_dispatch=True)
    assert service.serving
    watch.look(100.0, could_dispatch=False)  # nothing could go: waiting is no stall
    assert service.serving


# -- the request events ----------------------------------------------------------------------------------------
def test_request_events_release_a_closing_ticket_from_where_it_is() -> None:
    h = Harness(cap=1)
    queued, running = h.submit("a"), h.submit("a")
    (sent,) = h.dispatch()
    assert sent is queued and running.state is TicketState.QUEUED
    running.close()  # the caller left while queued: out of the queue, nothing at the backend
    assert running.outcome is Outcome.CANCELLED and h.queued() == 0 and h.handle.estimator.in_flight == 1
    queued.close(Outcome.COMPLETED)  # the backend is free again, and the loop is woken to use it
    assert h.handle.estimator.in_flight == 0 and h.dispatcher.loop.take_wake()


def test_request_events_queue_a_failure_again_only_when_the_failover_rule_allows_it() -> None:
    h = Harness(cap=2, model={"failover_attempts": 1})
    first, second = h.submit("a"), h.submit("a")
    h.dispatch()
    assert not h.events.fail_over(first, BackendRejectedRequest("bad request")), "not the engine's availability"
    assert h.events.fail_over(second, BackendUnavailable("down"))
    assert second.state is TicketState.QUEUED and h.events.position(second) == 1
    assert h.handle.cooling_for(h.clock.now()) > 0
    h.clock.advance(60.0)
    assert h.dispatch() == [second]
    assert not h.events.fail_over(second, BackendUnavailable("down")), "its one failover is spent"

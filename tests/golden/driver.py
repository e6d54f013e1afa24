"""The one module of the golden trace that touches the scheduler's core: everything else speaks to it.

`GoldenDriver` runs one model's real core (admission's `build_request`, `Scheduler`, its `ModelDispatcher`
with the queue book, run ledger, decision pass, fairness, ordering, band and backend-choice policies, gates
and load estimators) on a virtual clock, with no event loop, no sockets and no sleeps. Its interface is
what happens from outside:

    admit(...)              a client's call arrives (its request is built and queued as admission does)
    advance_to(t)           virtual time passes; the core's own timers fire on the way (a queued request's
                            deadline, the dispatch loop's wake-up for a fairness policy's held choice)
    accepted / tokens / finished / failed(label, ...)   what the engine a request was sent to says
    reading / scrape_failed(backend, ...)               a scrape of an engine's metrics
    cancel(label)           the client leaves (queued or running)
    take_events()           what the core decided since the last call, in order, as plain dicts:
                            dispatch, requeue (failover), end (outcome), reject (admission refused)

Requests are named by the caller's labels (the server's random ids are replaced by them), engines and
classes by their configured names, and times are milliseconds since the start: the events say nothing of
the core's classes, so when the core is rebuilt only this module changes and the recorded traces stay
byte for byte what they are.

How the driver stands in for the parts that are not run here:
- the dispatch loop (`loop.DispatchLoop.run`): after every input, while the loop has been woken
  (`take_wake`) it runs one pass (`ModelDispatcher.decide`) and then arms the wake-up the fairness policies
  ask for (`choose_again_at`, the earliest `wake_at`); `advance_to` fires it when its time comes. A wake-up
  asked for a time already past makes the real loop pass again at once; the driver runs one such pass and
  drops the timer;
- each request's run (`request_run.RequestRun`, in its caller's task): the engine's events go to the
  model's `RequestEvents` as the run reports them (`on_accepted`, `on_first_token` with the first token,
  `on_generated`, the missed tokens of the engine's usage at the end, `fail_over` for a failure before any
  text was shown, else the failed outcome); a cancelled client closes the ticket;
- a waiting request's own deadline timer (`Ticket.wait_dispatched`): the queued request is expired when
  the clock reaches its deadline;
- the metrics monitor (`scheduler._monitor`): a reading goes to the backend's handle and wakes the
  dispatcher.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Sequence
from typing import Any

from backends.base import BackendLoad, ChatMessage
from backends.errors import BackendError, BackendOverloaded, BackendRejectedRequest, BackendUnavailable
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.app.stepped import SteppedClock, good_reading, inert_backend, pass_while_woken, report_tokens
from scheduler_svc.config import Config
from scheduler_svc.core.admission import build_request
from scheduler_svc.core.errors import SchedulerError
from scheduler_svc.core.request import ClientRequest
from scheduler_svc.core.ticket import Outcome, Ticket, TicketState
from scheduler_svc.dispatch.metrics import SchedulerMetrics
from scheduler_svc.dispatch.scheduler import Scheduler
from scheduler_svc.policies import (
    BACKEND_POLICIES,
    BAND_POLICIES,
    FAIRNESS_POLICIES,
    ORDERING_POLICIES,
    scheduling_params,
)
from tests.quiet_observer import QuietObserver

START = 1000.0  # the virtual clock's reading at time 0 (any value: the events count from it)

Event = dict[str, Any]

# the engine failures a fake engine may report, by name
ENGINE_ERRORS: dict[str, type[BackendError]] = {
    "unavailable": BackendUnavailable,  # connection refused or dropped: failover may send it elsewhere
    "overloaded": BackendOverloaded,  # HTTP 429 / 503: failover too
    "rejected": BackendRejectedRequest,  # HTTP 4xx about the request itself: it fails as it is
}


class _Outcomes(QuietObserver):
    """The model's observer (as a cluster follower would be): hears failovers and outcomes in order."""

    def __init__(self, driver: GoldenDriver) -> None:
        self._driver = driver

    def on_failed_over(self, ticket: Ticket, error: BackendError) -> None:
        self._driver._record("requeue", ticket.request.request_id)

    def on_outcome(self, ticket: Ticket) -> None:
        outcome = ticket.outcome.value if ticket.outcome is not None else "?"
        self._driver._record("end", ticket.request.request_id, outcome=outcome)


class GoldenDriver:
    """One model's core on a virtual clock, driven one outside event at a time (see the module docstring)."""

    def __init__(self, raw_config: dict[str, Any]) -> None:
        self.config = config_from_dict(raw_config)
        (model,) = self.config.models
        self._model = model.name
        self._clock = SteppedClock(START)
        self._scheduler = Scheduler(
            self.config, backend_factory=inert_backend, clock=self._clock, metrics=SchedulerMetrics()
        )
        self._dispatcher = self._scheduler.dispatchers[model.name]
        self._dispatcher.observe_sends(self._dispatched)
        self._dispatcher.cluster.observe(_Outcomes(self))
        self._handles = {h.name: h for h in self._dispatcher.backends}
        self._tickets: dict[str, Ticket] = {}  # label -> ticket, in admission order
        self._deadlines: dict[str, Ticket] = {}  # the live ones with a deadline, in admission order
        self._shown: set[str] = set()  # labels whose current attempt has shown text to the client
        self._wake_at: float | None = None  # the dispatch loop's armed wake-up
        self._events: list[Event] = []

    # -- time -------------------------------------------------------------------------------------------
    def now(self) -> float:
        """Seconds since the start."""
        return self._clock.now() - START

    def advance_to(self, seconds: float) -> None:
        """Move the clock to `seconds` since the start, firing the core's timers due on the way, each at its
        own time: queued requests' deadlines (in deadline order, then admission order), then the loop's
        wake-up."""
        target = START + seconds
        while True:
            timer = self._next_timer()
            if timer is None or timer[0] > target:
                break
            when, fire = timer
            self._clock.move_to(when)
            fire()
            self._settle()
        self._clock.move_to(target)

    def _next_timer(self) -> tuple[float, Callable[[], None]] | None:
        best: tuple[float, Callable[[], None]] | None = None
        for label, ticket in list(self._deadlines.items()):
            if ticket.state is not TicketState.QUEUED:
                if ticket.state is TicketState.DONE:
                    del self._deadlines[label]
                continue
            deadline = ticket.request.deadline
            assert deadline is not None
            if best is None or deadline < best[0]:
                best = (deadline, self._expirer(ticket))
        if self._wake_at is not None and (best is None or self._wake_at < best[0]):
            best = (self._wake_at, self._fire_wake)
        return best

    def _expirer(self, ticket: Ticket) -> Callable[[], None]:
        def expire() -> None:
            if ticket.state is TicketState.QUEUED:
                self._dispatcher.events.expire(ticket)

        return expire

    def _fire_wake(self) -> None:
        self._wake_at = None
        self._dispatcher.wake()

    def _settle(self) -> None:
        """What the dispatch loop does once woken: a pass, then the wake-up the fairness policies ask for."""
        self._wake_at = pass_while_woken(self._dispatcher, self._clock.now(), self._wake_at)

    # -- clients ----------------------------------------------------------------------------------------
    def admit(
        self,
        label: str,
        *,
        user: str,
        priority_class: str,
        max_tokens: int,
        prompt: str = "",
        messages: Sequence[tuple[str, str]] = (),
        timeout: float | None = None,
        cache_key: str = "",
    ) -> bool:
        """A call arrives: built and queued as admission does; False when refused (a `reject` event)."""
        params = ClientRequest(
            model=self._model,
            prompt=prompt,
            messages=tuple(ChatMessage(role, content) for role, content in messages),
            max_tokens=max_tokens,
            priority_class=priority_class,
            prompt_cache_key=cache_key,
        )
        try:
            request = build_request(params, user=user, config=self.config, now=self._clock.now(), timeout=timeout)
            request = dataclasses.replace(request, request_id=label)  # the caller's stable label, not a uuid
            ticket = self._scheduler.admit(request)
        except SchedulerError as exc:
            self._record_event({"ev": "reject", "req": label, "reason": exc.reason})
            return False
        self._tickets[label] = ticket
        if request.deadline is not None:
            self._deadlines[label] = ticket
        self._settle()
        return True

    def cancel(self, label: str) -> None:
        """The client leaves (its call is cancelled, or its deadline passed), whatever the request's state."""
        self._tickets[label].close()
        self._settle()

    # -- engines ----------------------------------------------------------------------------------------
    def accepted(self, label: str) -> None:
        """The engine took the request (its response started)."""
        self._dispatcher.events.on_accepted(self._running(label))
        self._settle()

    def tokens(self, label: str, count: int) -> None:
        """The engine streamed `count` more tokens of the request (the first marks its first token)."""
        report_tokens(self._dispatcher.events, self._running(label), count, self._clock.now())
        self._shown.add(label)
        self._settle()

    def finished(self, label: str, completion_tokens: int) -> None:
        """The engine finished the request, reporting `completion_tokens` in its usage."""
        ticket = self._running(label)
        missed = completion_tokens - ticket.completion_tokens
        if missed > 0:
            ticket.completion_tokens += missed
            self._dispatcher.events.on_generated(ticket, missed)
        ticket.close(Outcome.COMPLETED)
        self._settle()

    def failed(self, label: str, error: str) -> None:
        """The engine failed the request (`error`: a name in ENGINE_ERRORS); before any text was shown it
        may be queued again (failover), else it fails."""
        ticket = self._running(label)
        exc = ENGINE_ERRORS[error](f"{error} at {ticket.backend.name if ticket.backend else '?'}")
        requeued = label not in self._shown and self._dispatcher.events.fail_over(ticket, exc)
        if not requeued:
            ticket.close(Outcome.FAILED)
        self._settle()

    def reading(
        self,
        backend: str,
        *,
        waiting: int,
        running: int,
        tpot_seconds: float | None = None,
        kv_cache_usage: float | None = None,
        cache_tokens: int | None = None,
    ) -> None:
        """A good scrape of the engine's metrics, taken now."""
        load = good_reading(
            self._clock.now(),
            waiting=waiting,
            running=running,
            tpot_seconds=tpot_seconds,
            kv_cache_usage=kv_cache_usage,
            cache_tokens=cache_tokens,
        )
        self._handles[backend].record_reading(load)
        self._dispatcher.wake()
        self._settle()

    def scrape_failed(self, backend: str) -> None:
        """A scrape of the engine's metrics failed."""
        self._handles[backend].record_reading(BackendLoad(ok=False, read_at=self._clock.now(), error="unreachable"))
        self._dispatcher.wake()
        self._settle()

    # -- what the core decided ----------------------------------------------------------------------
    def take_events(self) -> list[Event]:
        """The events since the last call, in order."""
        events, self._events = self._events, []
        return events

    def live(self) -> int:
        """Requests admitted and not ended."""
        return sum(1 for t in self._tickets.values() if t.state is not TicketState.DONE)

    def _running(self, label: str) -> Ticket:
        ticket = self._tickets[label]
        assert ticket.state is TicketState.DISPATCHED, f"{label} is {ticket.state.value}, not at an engine"
        return ticket

    def _dispatched(self, ticket: Ticket) -> None:
        """Record a dispatch as the ticket's run would see it: once the dispatcher hands the ticket over."""
        label = ticket.request.request_id
        backend = ticket.backend
        assert backend is not None and ticket.dispatched_at is not None
        ticket.sent_at = ticket.dispatched_at  # the run sends the request to the engine at once
        self._shown.discard(label)
        request = ticket.request
        self._record(
            "dispatch",
            label,
            user=request.user,
            cls=request.priority_class,
            backend=backend.name,
            prio=ticket.engine_priority,
            attempt=ticket.attempts,
        )

    def _record(self, kind: str, label: str, **fields: Any) -> None:
        self._record_event({"ev": kind, "req": label, **fields})

    def _record_event(self, event: Event) -> None:
        self._events.append({"t": round((self._clock.now() - START) * 1000), **event})


# -- what a golden configuration must state ---------------------------------------------------------------
def unstated_fields(raw: dict[str, Any]) -> list[str]:
    """The configuration fields `raw` (a config file's parsed tables) leaves to their defaults: every field
    of every section, of every entry of a list of sections, and every parameter a registered policy reads
    from [scheduling] (whichever is chosen: each scenario states them all)."""
    return _unstated(Config, raw, "")


def _unstated(cls: type[Any], raw: dict[str, Any], where: str) -> list[str]:
    missing: list[str] = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        name = f"{where}{field.name}"
        if field.metadata.get("extra"):  # the policies' own parameters, among the table's keys
            missing += [f"{where}{key}" for key in sorted(scheduling_params()) if key not in raw]
            continue
        if field.name not in raw:
            missing.append(name)
            continue
        hint = hints[field.name]
        item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else None
        if dataclasses.is_dataclass(hint):
            missing += _unstated(typing.cast(type[Any], hint), raw[field.name], name + ".")
        elif item is not None and dataclasses.is_dataclass(item):
            for i, entry in enumerate(raw[field.name]):
                missing += _unstated(typing.cast(type[Any], item), entry, f"{name}[{i}].")
    return missing


def policy_names() -> dict[str, set[str]]:
    """Every registered policy name by kind: what the golden scenarios must cover."""
    return {
        "fairness": set(FAIRNESS_POLICIES.describe()),
        "ordering": set(ORDERING_POLICIES.describe()),
        "band": set(BAND_POLICIES.describe()),
        "backend": set(BACKEND_POLICIES.describe()),
    }

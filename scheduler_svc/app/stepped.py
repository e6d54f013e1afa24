"""The service's core on a clock its caller moves: admission, queues, dispatchers, policies and gates, with
no event loop, no sockets and no sleeps, for simulations that run hours of traffic in minutes (the scale
bench's S9); its clock and inert adapters also serve the golden dispatch traces.

`SteppedCore` is the `Scheduler` of a configuration, each backend an inert adapter (its requests are run by
the caller). The caller plays the engines and the clients and tells the core what happens, in time order:

    admit(...)                 a client's call arrives: built and queued as admission does (or `Refused`)
    settle()                   the dispatch loops pass while woken; returns the requests handed to backends
    next_timer() / advance_to  the clock; a fairness policy's held choice is chosen again at its time
    accepted / tokens / finished / cancel(request_id)   what the engine and the client do with a request
    reading(model, backend, ...)                       a scrape of an engine's metrics

It stands in for the parts that are not run: each request's run (the caller reports its engine's events
as `request_run.RequestRun` would), the dispatch loop (`settle` passes as `loop.DispatchLoop.run` does
once woken, and arms the wake-up of a held choice), and the metrics monitor (`reading`). Everything it
calls is the service's own code, so what the core decides and what it costs are the service's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from backends.base import Backend, BackendLoad, GenerationEvent, GenerationRequest
from backends.fake import FakeBackend
from backends.registry import capabilities
from scheduler_svc.config import BackendConfig, Config, ModelConfig
from scheduler_svc.core.admission import build_request
from scheduler_svc.core.errors import SchedulerError
from scheduler_svc.core.request import ClientRequest
from scheduler_svc.core.ticket import Outcome, Ticket
from scheduler_svc.dispatch.dispatcher import ModelDispatcher
from scheduler_svc.dispatch.metrics import SchedulerMetrics
from scheduler_svc.dispatch.request_events import RequestEvents
from scheduler_svc.dispatch.scheduler import Scheduler


class Refused(Exception):
    """Admission refused the call (its reason is the error's, as a client would be told)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(slots=True)
class Sent:
    """A request the core handed to a backend: what the caller's engine needs to run it (read-only; not frozen:
    one is built for every request sent, inside the pass a driver may be timing)."""

    request_id: str
    model: str
    backend: str
    user: str
    priority_class: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    engine_priority: int | None
    admitted_at: float


class SteppedClock:
    """The core's clock, moved only by its caller (never backwards)."""

    def __init__(self, start: float) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def move_to(self, when: float) -> None:
        self._now = max(self._now, when)


async def _not_run(request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:  # pragma: no cover
    raise AssertionError("a stepped core's requests are run by its caller, never by the adapter")
    yield


def inert_backend(model: ModelConfig, backend: BackendConfig) -> Backend:
    """An adapter with the configured kind's capabilities that runs nothing (the caller plays the engine)."""
    caps = capabilities(backend.kind)
    caps = dataclasses.replace(caps, supports_priority=caps.supports_priority and backend.priority_scheduling)
    return FakeBackend(_not_run, name=backend.name, capabilities=caps)


def pass_while_woken(dispatcher: ModelDispatcher, now: float, armed: float | None) -> float | None:
    """What a model's dispatch loop does once woken (`loop.DispatchLoop.run`): pass while woken, then arm the
    wake-up its fairness policies ask for; one asked for a time already past makes the loop pass again at
    once, once. Returns the armed wake-up (`armed` itself when nothing woke the loop)."""
    loop = dispatcher.loop
    repeated = False
    while loop.take_wake():
        dispatcher.decide()
        armed = loop.choose_again_at()
        if armed is not None and armed <= now:
            armed = None
            if not repeated:
                repeated = True
                loop.wake()
    return armed


def report_tokens(events: RequestEvents, ticket: Ticket, count: int, now: float) -> None:
    """The engine streamed `count` more tokens of a running request, as its run reports them (the first of
    them marks the request's first token)."""
    if ticket.first_token_at is None:
        ticket.first_token_at = now
        events.on_first_token(ticket)
    ticket.completion_tokens += count
    events.on_generated(ticket, count)


def good_reading(
    now: float,
    *,
    waiting: int,
    running: int,
    tpot_seconds: float | None = None,
    kv_cache_usage: float | None = None,
    cache_tokens: int | None = None,
) -> BackendLoad:
    """A successful scrape of an engine's metrics, taken `now`, as the metrics monitor records it."""
    return BackendLoad(
        ok=True,
        read_at=now,
        waiting=waiting,
        running=running,
        tpot_seconds=tpot_seconds,
        kv_cache_usage=kv_cache_usage,
        cache_tokens=cache_tokens,
    )


class SteppedCore:
    """The core of `config` on a stepped clock (see the module docstring)."""

    def __init__(self, config: Config, *, start: float = 1000.0) -> None:
        self.config = config
        self.clock = SteppedClock(start)
        self.scheduler = Scheduler(config, backend_factory=inert_backend, clock=self.clock, metrics=SchedulerMetrics())
        self._tickets: dict[str, Ticket] = {}  # request id -> ticket, while it is live
        self._sent: list[Sent] = []
        self._wake_at: dict[str, float | None] = {}  # model -> its armed wake-up
        for name, dispatcher in self.scheduler.dispatchers.items():
            dispatcher.observe_sends(self._observer(name))
        self._handles = {
            (name, h.name): h for name, dispatcher in self.scheduler.dispatchers.items() for h in dispatcher.backends
        }

    def now(self) -> float:
        return self.clock.now()

    # -- clients ------------------------------------------------------------------------------------------
    def admit(
        self,
        *,
        model: str,
        user: str,
        prompt: str,
        max_tokens: int,
        priority_class: str = "",
        request_id: str | None = None,
    ) -> str:
        """A call arrives; returns the request's id (`request_id` replaces the server's own, if given).
        Raises `Refused` as admission would refuse the call. The core is not settled: call `settle`."""
        params = ClientRequest(model=model, prompt=prompt, max_tokens=max_tokens, priority_class=priority_class)
        try:
            request = build_request(params, user=user, config=self.config, now=self.now(), timeout=None)
            if request_id is not None:
                request.request_id = request_id
            ticket = self.scheduler.admit(request)
        except SchedulerError as exc:
            raise Refused(exc.reason, str(exc)) from exc
        self._tickets[request.request_id] = ticket
        return request.request_id

    def cancel(self, request_id: str) -> None:
        """The client leaves, wherever its request is."""
        self._tickets.pop(request_id).close()

    # -- the loop -----------------------------------------------------------------------------------------
    def settle(self) -> list[Sent]:
        """Pass as the dispatch loops would after what happened: each woken model's dispatcher decides, then
        arms the wake-up its fairness policies ask for (one asked for a time already past makes the loop
        pass again at once, once). Returns the requests handed to backends."""
        now = self.now()
        for name, dispatcher in self.scheduler.dispatchers.items():
            self._wake_at[name] = pass_while_woken(dispatcher, now, self._wake_at.get(name))
        sent, self._sent = self._sent, []
        return sent

    def next_timer(self) -> float | None:
        """When the core must pass again by itself (a held fairness choice), None when it need not."""
        due = [t for t in self._wake_at.values() if t is not None]
        return min(due) if due else None

    def advance_to(self, when: float) -> list[Sent]:
        """Move the clock to `when`, passing at each armed wake-up on the way; returns what went."""
        sent: list[Sent] = []
        while (due := self.next_timer()) is not None and due <= when:
            self.clock.move_to(due)
            for name, at in self._wake_at.items():
                if at is not None and at <= due:
                    self._wake_at[name] = None
                    self.scheduler.dispatchers[name].wake()
            sent += self.settle()
        self.clock.move_to(when)
        return sent

    # -- engines ------------------------------------------------------------------------------------------
    def accepted(self, request_id: str) -> None:
        """The engine took the request (its response started)."""
        ticket = self._tickets[request_id]
        self._events(ticket).on_accepted(ticket)

    def tokens(self, request_id: str, count: int) -> None:
        """The engine streamed `count` more tokens (the first of them marks the request's first token)."""
        ticket = self._tickets[request_id]
        report_tokens(self._events(ticket), ticket, count, self.now())

    def finished(self, request_id: str) -> None:
        """The engine finished the request."""
        self._tickets.pop(request_id).close(Outcome.COMPLETED)

    def reading(
        self,
        model: str,
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
            self.now(),
            waiting=waiting,
            running=running,
            tpot_seconds=tpot_seconds,
            kv_cache_usage=kv_cache_usage,
            cache_tokens=cache_tokens,
        )
        self._handles[(model, backend)].record_reading(load)
        self.scheduler.dispatchers[model].wake()

    # -- wiring -------------------------------------------------------------------------------------------
    def _events(self, ticket: Ticket) -> RequestEvents:
        return self.scheduler.dispatchers[ticket.request.model].events

    def _observer(self, model: str) -> Callable[[Ticket], None]:
        def sent(ticket: Ticket) -> None:
            ticket.sent_at = self.now()  # the run sends the request to the engine at once
            request = ticket.request
            assert ticket.backend is not None
            self._sent.append(
                Sent(
                    request.request_id,
                    model,
                    ticket.backend.name,
                    request.user,
                    request.priority_class,
                    request.prompt or "",
                    request.prompt_tokens_estimate,
                    request.max_tokens,
                    ticket.engine_priority,
                    request.admitted_at,
                )
            )

        return sent

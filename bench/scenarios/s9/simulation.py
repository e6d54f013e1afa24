"""S9's world: the service's core (`scheduler_svc.app.stepped.SteppedCore`) between clients
and simulated engines (`engine.BatchEngine`), on one virtual clock, in one process, with no sockets.

Events run in time order from one queue (ties in the order they were scheduled): a client's call arrives,
a dispatched request reaches its engine (`accept_seconds` later: the engine then answers, `accepted`), an
engine's batch changes (first tokens, tokens in groups, ends), an engine is scraped (every engine every
`scrape_interval_seconds`, spread over the interval), and the core's own wake-up for a held fairness
choice. After each event the core passes as its dispatch loops would (`settle`), and what it sends is
delivered to the engines.

Observers (`Observer`) see every call, dispatch, token and end, and every run of engine steps, to measure
what they need; the CPU the core spends deciding is measured around `settle` (`decision_cpu`).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from bench.product import Refused, Sent, SimConfig, SteppedCore, load_config
from bench.scenarios.s9.engine import BatchEngine, Job

ACCEPT_SECONDS = 0.002  # from a dispatch to the engine holding the request (the HTTP request and its answer)


@dataclass(frozen=True, slots=True)
class Call:
    """A client's call: when, for which model, from whom, what."""

    at: float
    model: str
    user: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    priority_class: str = ""
    account: str = ""  # who the call is counted for when `user` is not the caller the bench measures


class Observer:
    """Hears what happens in a simulation (every method optional)."""

    def admitted(self, call: Call, request_id: str, now: float) -> None: ...

    def refused(self, call: Call, reason: str, now: float) -> None: ...

    def sent(self, sent: Sent, call: Call, now: float) -> None: ...

    def first_token(self, call: Call, now: float) -> None: ...

    def tokens(self, call: Call, count: int, now: float) -> None: ...

    def finished(self, call: Call, now: float) -> None: ...

    def steps(self, model: str, engine: BatchEngine, count: int, batch: int, now: float) -> None: ...

    def passed(self, cpu_ns: int, sent: int, now: float) -> None: ...


@dataclass
class Simulation:
    """One run: the core of `raw_config` (a config file's tables), an engine per backend, and the calls."""

    raw_config: dict[str, Any]
    engines: dict[tuple[str, str], SimConfig]  # (model, backend) -> its engine's model
    observers: list[Observer] = field(default_factory=list)
    report_every: int = 64
    start: float = 1000.0

    def __post_init__(self) -> None:
        self.config = load_config(self.raw_config)
        self.core = SteppedCore(self.config, start=self.start)
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._calls: dict[str, Call] = {}  # live request id -> its call
        self._engines = {
            key: BatchEngine(key[1], sim, self.at, _Listener(self, key[0]), self.report_every)
            for key, sim in self.engines.items()
        }
        self.decision_cpu_ns = 0
        for model in self.config.models:
            interval = min(b.scrape_interval_seconds for b in model.backends)
            for i, backend in enumerate(model.backends):  # each model's engines spread evenly over its interval
                offset = interval * i / len(model.backends)
                self.at(self.start + offset, self._scraper(model.name, backend.name, backend.scrape_interval_seconds))

    def now(self) -> float:
        return self.core.now()

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (max(when, self.now()), next(self._seq), action))

    def engine(self, model: str, backend: str) -> BatchEngine:
        return self._engines[(model, backend)]

    def arrive(self, call: Call) -> None:
        """A call arrives now (outside `feed`): admitted, and the core passes."""
        self._arrive(call, lambda: None)
        self._deliver(self._timed(self.core.settle))

    def feed(self, calls: Iterator[Call]) -> None:
        """The clients' calls, in time order (taken one at a time as the clock reaches them)."""

        def next_call() -> None:
            call = next(calls, None)
            if call is not None:
                self.at(call.at, lambda: self._arrive(call, next_call))

        next_call()

    def run_until(self, end: float, *, stop: Callable[[], bool] = lambda: False) -> None:
        """Run events up to clock time `end` (or until `stop()` says so after an event)."""
        core = self.core
        while self._queue and not stop():
            when = self._queue[0][0]
            timer = core.next_timer()
            if timer is not None and timer <= when and timer <= end:
                self._deliver(self._timed(partial(core.advance_to, timer)))
                continue
            if when > end:
                break
            _, _, action = heapq.heappop(self._queue)
            core.advance_to(when)
            action()
            self._deliver(self._timed(core.settle))
        core.advance_to(end)

    # -- clients ------------------------------------------------------------------------------------------
    def _arrive(self, call: Call, then: Callable[[], None]) -> None:
        try:
            request_id = self.core.admit(
                model=call.model,
                user=call.user,
                prompt=call.prompt,
                max_tokens=call.max_tokens,
                priority_class=call.priority_class,
            )
        except Refused as refused:
            for observer in self.observers:
                observer.refused(call, refused.reason, self.now())
        else:
            self._calls[request_id] = call
            for observer in self.observers:
                observer.admitted(call, request_id, self.now())
        then()

    # -- the core -----------------------------------------------------------------------------------------
    def _timed(self, step: Callable[[], list[Sent]]) -> list[Sent]:
        started = time.process_time_ns()
        sent = step()
        spent = time.process_time_ns() - started
        self.decision_cpu_ns += spent
        for observer in self.observers:
            observer.passed(spent, len(sent), self.now())
        return sent

    def _deliver(self, sent: list[Sent]) -> None:
        for request in sent:
            call = self._calls[request.request_id]
            for observer in self.observers:
                observer.sent(request, call, self.now())
            job = Job(
                request.request_id,
                request.prompt,
                call.prompt_tokens,
                request.max_tokens,
                request.engine_priority or 0,
                0,
            )
            engine = self._engines[(request.model, request.backend)]
            self.at(self.now() + ACCEPT_SECONDS, partial(self._reach, engine, job))

    def _reach(self, engine: BatchEngine, job: Job) -> None:
        engine.add(job, self.now())
        self.core.accepted(job.request_id)

    def _scraper(self, model: str, backend: str, interval: float) -> Callable[[], None]:
        engine = self._engines[(model, backend)]

        def scrape() -> None:
            shown = engine.reading()
            self.core.reading(
                model,
                backend,
                waiting=shown.waiting,
                running=shown.running,
                tpot_seconds=shown.tpot_seconds,
                cache_tokens=shown.cache_tokens,
            )
            self.at(self.now() + interval, scrape)

        return scrape

    # -- what the engines say -------------------------------------------------------------------------------
    def _first_token(self, job: Job) -> None:
        self.core.tokens(job.request_id, 1)
        call = self._calls[job.request_id]
        for observer in self.observers:
            observer.first_token(call, self.now())
            observer.tokens(call, 1, self.now())

    def _tokens(self, job: Job, count: int) -> None:
        self.core.tokens(job.request_id, count)
        call = self._calls[job.request_id]
        for observer in self.observers:
            observer.tokens(call, count, self.now())

    def _finished(self, job: Job) -> None:
        self.core.finished(job.request_id)
        call = self._calls.pop(job.request_id)
        for observer in self.observers:
            observer.finished(call, self.now())


class _Listener:
    """An engine's events, into the simulation (and its model's name for the observers)."""

    def __init__(self, simulation: Simulation, model: str) -> None:
        self._simulation = simulation
        self._model = model

    def first_token(self, engine: BatchEngine, job: Job) -> None:
        self._simulation._first_token(job)

    def tokens(self, engine: BatchEngine, job: Job, count: int) -> None:
        self._simulation._tokens(job, count)

    def finished(self, engine: BatchEngine, job: Job) -> None:
        self._simulation._finished(job)

    def steps(self, engine: BatchEngine, count: int, batch: int) -> None:
        for observer in self._simulation.observers:
            observer.steps(self._model, engine, count, batch, self._simulation.now())

"""Runs one golden scenario: the workload's clients and fake engines around the core, on virtual time.

A discrete-event simulation on a millisecond grid: client calls, client cancellations, engines accepting,
stepping (one token per running request per step) and failing requests, and metrics scrapes, each at its
time, in a fixed order for equal times (the order they were scheduled in). The core is reached only
through `GoldenDriver`; what it decides comes back as its events, which are the trace, and which the
engines act on (a dispatch reaches its engine `accept_ms` later; an ended request leaves its engine).
Randomness: the workload's seed, and one `random.Random` per engine seeded from its name.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import random
from collections.abc import Callable
from typing import Any

from tests.golden.driver import Event, GoldenDriver
from tests.golden.scenarios import ENGINES, EngineSpec, Scenario
from tests.golden.workload import SEED, Call, build_workload

DRAIN_LIMIT_MS = 60_000  # the workload ends long before: a run still busy here is stuck


class FakeEngine:
    """One engine: a waiting queue (by priority, or in arrival order), slots, and steps."""

    def __init__(self, name: str, spec: EngineSpec, sim: Simulation) -> None:
        self.name = name
        self.spec = spec
        self._sim = sim
        self._rng = random.Random(f"{SEED}-{name}")
        self._arrivals = itertools.count()
        self.in_transit: dict[str, int | None] = {}  # label -> engine priority, sent and not arrived yet
        self.waiting: list[tuple[int, int, str]] = []  # (engine priority or 0, arrival, label)
        self.running: dict[str, int] = {}  # label -> tokens generated
        self._stepping = False
        self.last_step_ms: int | None = None

    def sent(self, label: str, priority: int | None, now_ms: int) -> None:
        self.in_transit[label] = priority
        self._sim.at(now_ms + self.spec.accept_ms, lambda t: self._arrive(label, t))

    def remove(self, label: str) -> None:
        """The request ended in the scheduler (its client left, or it failed): the engine drops it."""
        self.in_transit.pop(label, None)
        self.running.pop(label, None)
        self.waiting = [w for w in self.waiting if w[2] != label]

    def _arrive(self, label: str, now_ms: int) -> None:
        if label not in self.in_transit:
            return  # it ended on the way
        priority = self.in_transit.pop(label)
        call = self._sim.calls[label]
        outage = self.spec.outage_ms
        error = None
        if call.engine_rejects:
            error = "rejected"
        elif outage is not None and outage[0] <= now_ms < outage[1]:
            error = "unavailable"
        elif self.spec.fail_chance and self._rng.random() < self.spec.fail_chance:
            error = self._rng.choice(["unavailable", "overloaded"])
        if error is not None:
            self._sim.driver.failed(label, error)
            self._sim.collect()
            return
        rank = priority if self.spec.serves_by_priority and priority is not None else 0
        self.waiting.append((rank, next(self._arrivals), label))
        self._sim.driver.accepted(label)
        self._sim.collect()
        if not self._stepping:
            self._start_step(now_ms)

    def _start_step(self, now_ms: int) -> None:
        free = self.spec.slots - self.spec.foreign_running - len(self.running)
        if free > 0 and self.waiting:
            self.waiting.sort()
            admitted, self.waiting = self.waiting[:free], self.waiting[free:]
            self.running.update((label, 0) for _, _, label in admitted)
        if not self.running:
            self._stepping = False
            return
        self._stepping = True
        batch = len(self.running) + self.spec.foreign_running
        duration = self.spec.step_ms + self.spec.step_ms_per_request * batch
        self._sim.at(now_ms + duration, lambda t: self._end_step(t, duration))

    def _end_step(self, now_ms: int, duration: int) -> None:
        self.last_step_ms = duration
        driver = self._sim.driver
        for label in list(self.running):
            if label not in self.running:
                continue  # ended by an earlier request's events in this step
            call = self._sim.calls[label]
            generated = self.running[label] + 1
            self.running[label] = generated
            if call.drop_after_tokens is not None and generated > call.drop_after_tokens:
                del self.running[label]
                driver.failed(label, "unavailable")
                self._sim.collect()
                continue
            driver.tokens(label, 1)
            self._sim.collect()
            if label not in self.running:
                continue
            if generated >= call.answer_tokens:
                del self.running[label]
                driver.finished(label, generated)
                self._sim.collect()
            elif call.cancel_after_tokens is not None and generated >= call.cancel_after_tokens:
                driver.cancel(label)
                self._sim.collect()
        self._start_step(now_ms)

    def scrape(self, now_ms: int) -> None:
        outage = self.spec.metrics_outage_ms
        if outage is not None and outage[0] <= now_ms < outage[1]:
            self._sim.driver.scrape_failed(self.name)
        else:
            running = len(self.running) + self.spec.foreign_running
            self._sim.driver.reading(
                self.name,
                waiting=len(self.waiting),
                running=running,
                tpot_seconds=None if self.last_step_ms is None else self.last_step_ms / 1000,
                kv_cache_usage=running / self.spec.slots if self.spec.exports_kv_usage else None,
                cache_tokens=self.spec.cache_tokens,
            )
        self._sim.collect()


class Simulation:
    """The workload's clients and the fake engines around one `GoldenDriver`."""

    def __init__(self, scenario: Scenario) -> None:
        config = scenario.config()
        self.driver = GoldenDriver(config)
        self.calls = {call.label: call for call in build_workload()}
        self.engines = {name: FakeEngine(name, spec, self) for name, spec in ENGINES.items()}
        self._where: dict[str, str] = {}  # label -> the engine it was last sent to
        self._admitted: set[str] = set()
        self._events: list[tuple[int, int, Callable[[int], None]]] = []
        self._order = itertools.count()
        self._calls_left = len(self.calls)
        self.trace: list[Event] = []
        for call in self.calls.values():
            self.at(call.at_ms, functools.partial(self._call, call))
            leave = [call.cancel_at_ms]
            if call.timeout_ms is not None:
                leave.append(call.at_ms + call.timeout_ms)  # the call's deadline: its client gives up
            for when in leave:
                if when is not None:
                    self.at(when, functools.partial(self._leave, call.label))
        for backend in config["models"][0]["backends"]:
            interval = round(backend["scrape_interval_seconds"] * 1000)
            self._scrape_every(self.engines[backend["name"]], interval, 0)

    def at(self, when_ms: int, action: Callable[[int], None]) -> None:
        heapq.heappush(self._events, (when_ms, next(self._order), action))

    def run(self) -> list[Event]:
        """Run until every call has arrived and ended; returns the core's events in order."""
        while True:
            when_ms, _, action = heapq.heappop(self._events)
            assert when_ms <= DRAIN_LIMIT_MS, f"still {self.driver.live()} requests live at {when_ms} ms"
            self.driver.advance_to(when_ms / 1000)
            self.collect()
            action(when_ms)
            if not self._calls_left and not self.driver.live():
                return self.trace

    def collect(self) -> None:
        """Take the core's new events into the trace, and let the engines act on them."""
        for event in self.driver.take_events():
            self.trace.append(event)
            label = event["req"]
            if event["ev"] == "dispatch":
                self._where[label] = event["backend"]
                self.engines[event["backend"]].sent(label, event["prio"], event["t"])
            elif event["ev"] == "end" and label in self._where:
                self.engines[self._where[label]].remove(label)

    def _call(self, call: Call, now_ms: int) -> None:
        self._calls_left -= 1
        admitted = self.driver.admit(
            call.label,
            user=call.user,
            priority_class=call.priority_class,
            max_tokens=call.max_tokens,
            prompt=call.prompt,
            messages=call.messages,
            timeout=None if call.timeout_ms is None else call.timeout_ms / 1000,
            cache_key=call.cache_key,
        )
        if admitted:
            self._admitted.add(call.label)
        self.collect()

    def _leave(self, label: str, now_ms: int) -> None:
        if label in self._admitted:
            self.driver.cancel(label)
            self.collect()

    def _scrape_every(self, engine: FakeEngine, interval_ms: int, first_ms: int) -> None:
        def scrape(now_ms: int) -> None:
            engine.scrape(now_ms)
            self.at(now_ms + interval_ms, scrape)

        self.at(first_ms, scrape)


def run_scenario(scenario: Scenario) -> list[str]:
    """The scenario's trace as the lines of its file: a header, then one event per line."""
    return [_line(scenario.header()), *(_line(event) for event in Simulation(scenario).run())]


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))

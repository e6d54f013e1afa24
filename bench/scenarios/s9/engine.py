"""The simulator's engine model, skipping ahead: continuous batching on a virtual clock, one event per
change of the batch instead of one per step.

It is the simulator's engine model (`backends.sim.engine.SimEngine`): a batch of at most `max_num_seqs`
running requests, the waiting queue served first come first served (or by (priority, arrival) with `scheduling_policy =
"priority"`), requests taken in at the start of a step while a slot is free, each step lasting
`step_seconds` (the simulator's own rule: a fixed part, a part per request in the batch, and the prefill of
the prompt tokens taken in, less those found in the prefix cache, `backends.sim.prefix_cache`), and every
running request given one token per step. Between two changes of the batch every step lasts the same, so
the model jumps from one change to the next: to the step in which the next request ends, or, when a slot
is free and a request arrives, to the step boundary at which it is taken in. The KV cache is taken as large
enough for the batch (`max_num_seqs` x the longest request), so nothing is preempted.

What the caller hears (`EngineListener`): a request's first token at the end of its first step, its
tokens in groups (at the batch changes, once `report_every` are new, and at its end), its end, and the
steps run (how many, with how many requests). `reading` is what a scrape of the engine's metrics shows:
the running and waiting counts now and the mean time between tokens since the last scrape.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from bench.product import PrefixCache, SimConfig, step_seconds

Schedule = Callable[[float, Callable[[], None]], None]
"""Run a callback at a clock time (the simulation's event queue)."""


@dataclass(eq=False)
class Job:
    """One request inside the engine."""

    request_id: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    priority: int
    arrived: int  # the engine's arrival number: first come first served among equal priorities
    generated: int = 0
    reported: int = 0  # tokens told to the listener so far
    cached_tokens: int = 0
    fresh: bool = field(default=True)  # taken in at the current segment's first step: prefilled there


class EngineListener(Protocol):
    def first_token(self, engine: BatchEngine, job: Job) -> None: ...

    def tokens(self, engine: BatchEngine, job: Job, count: int) -> None: ...

    def finished(self, engine: BatchEngine, job: Job) -> None: ...

    def steps(self, engine: BatchEngine, count: int, batch: int) -> None: ...


@dataclass(frozen=True)
class Reading:
    waiting: int
    running: int
    tpot_seconds: float | None
    cache_tokens: int


class BatchEngine:
    """One simulated engine (see the module docstring)."""

    def __init__(
        self, name: str, config: SimConfig, schedule: Schedule, listener: EngineListener, report_every: int = 64
    ) -> None:
        self.name = name
        self.config = config
        self._schedule = schedule
        self._listener = listener
        self._report_every = report_every
        self._by_priority = config.scheduling_policy == "priority"
        self._waiting: list[tuple[int, int, Job]] = []  # heap of (priority or 0, arrival, job)
        self.running: list[Job] = []
        self._arrivals = 0
        self._cache = PrefixCache(config.prefix_cache_blocks, config.kv_block_size)
        # the current segment: its start, first step, later steps, steps planned; None while idle
        self._segment: tuple[float, float, float, int] | None = None
        self._version = 0  # the current segment's number: an end scheduled for an older one is ignored
        self._gap_seconds = 0.0  # time between tokens since the last reading, summed over tokens
        self._gaps = 0
        self.steps_run = 0
        self._waking = False  # an idle engine's first step is scheduled

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def add(self, job: Job, now: float) -> None:
        """A request reaches the engine at `now`."""
        self._arrivals += 1
        job.arrived = self._arrivals
        heapq.heappush(self._waiting, (job.priority if self._by_priority else 0, job.arrived, job))
        if self._segment is None:
            if not self._waking:  # idle: the step starts once every request arriving at this instant is in
                self._waking = True
                self._schedule(now, partial(self._wake, now))
        elif len(self.running) < self.config.max_num_seqs:
            self._cut_at_next_boundary(now)

    def _wake(self, now: float) -> None:
        self._waking = False
        if self._segment is None:
            self._start(now)

    def reading(self) -> Reading:
        """What a scrape shows now; the time between tokens is the mean since the previous scrape."""
        tpot = self._gap_seconds / self._gaps if self._gaps else None
        self._gap_seconds, self._gaps = 0.0, 0
        return Reading(len(self._waiting), len(self.running), tpot, self.config.kv_cache_tokens)

    # -- the batch -------------------------------------------------------------------------------------------
    def _start(self, now: float) -> None:
        """A step starts at `now`: take in waiting requests while a slot is free, then plan the segment up
        to the step in which the first running request ends."""
        config = self.config
        fresh: list[Job] = []
        while self._waiting and len(self.running) < config.max_num_seqs:
            job = heapq.heappop(self._waiting)[2]
            job.cached_tokens = self._cache.lookup(job.prompt, job.prompt_tokens)
            job.fresh = True
            self.running.append(job)
            fresh.append(job)
        for job in fresh:
            self._cache.insert(job.prompt, job.prompt_tokens)
        if not self.running:
            self._segment = None
            return
        prefill = sum(job.prompt_tokens - job.cached_tokens for job in fresh)
        decode, prefill_seconds = step_seconds(config, len(self.running), prefill)
        first = decode + prefill_seconds
        steps = min(job.max_tokens - job.generated for job in self.running)
        self._plan(now, first, decode, steps)
        for job in fresh:
            self._schedule(now + first, partial(self._first_token, job))

    def _plan(self, start: float, first: float, step: float, steps: int) -> None:
        self._version += 1
        version = self._version
        self._segment = (start, first, step, steps)
        self._schedule(start + first + (steps - 1) * step, lambda: self._end(version))

    def _cut_at_next_boundary(self, now: float) -> None:
        """A request arrived while a slot is free: the segment ends at the next step boundary, where it is
        taken in."""
        assert self._segment is not None
        start, first, step, steps = self._segment
        boundary = 1 if now <= start + first else 1 + math.ceil((now - start - first) / step)
        if boundary < steps:
            self._plan(start, first, step, boundary)

    def _first_token(self, job: Job) -> None:
        if job.reported == 0 and job in self.running:
            job.reported = 1
            self._listener.first_token(self, job)

    def _end(self, version: int) -> None:
        """The planned steps ran: every running request got one token per step; those at their end leave,
        and the next segment starts."""
        if version != self._version or self._segment is None:
            return
        start, first, step, steps = self._segment
        now = start + first + (steps - 1) * step
        batch = len(self.running)
        fresh = sum(1 for job in self.running if job.fresh)
        self._gap_seconds += (batch - fresh) * first + batch * (steps - 1) * step
        self._gaps += (batch - fresh) + batch * (steps - 1)
        self.steps_run += steps
        self._listener.steps(self, steps, batch)
        staying: list[Job] = []
        for job in self.running:
            job.fresh = False
            job.generated += steps
            done = job.generated >= job.max_tokens
            if job.reported == 0:  # its first token falls in this segment's first step
                job.reported = 1
                self._listener.first_token(self, job)
            if done or job.generated - job.reported >= self._report_every:
                new = job.generated - job.reported
                job.reported = job.generated
                if new:
                    self._listener.tokens(self, job, new)
            if done:
                self._listener.finished(self, job)
            else:
                staying.append(job)
        self.running = staying
        self._start(now)

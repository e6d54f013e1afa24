"""One backend's metrics monitor: when each engine is read, and what a reading updates.

Engines are read in beats of a few (SCRAPES_PER_BEAT), the beats spread over the scrape interval on a fixed
grid of the loop's clock, so a hundred engines neither wake together nor drift into one read per loop pass.
The engines of one beat wait on one loop timer (`BeatTimer`): at a hundred engines read every 0.2 s, a
timer per engine would be 500 timers armed, fired and cancelled a second.
"""

from __future__ import annotations

import asyncio
import math

import structlog

from backends.base import BackendLoad
from scheduler_svc.core.clock import Clock
from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.dispatch.dispatcher import ModelDispatcher
from scheduler_svc.dispatch.health import InternalErrors
from scheduler_svc.dispatch.load import scrape
from scheduler_svc.dispatch.metrics import SchedulerMetrics, engine_series

log = structlog.get_logger(__name__)

# Engines read on the same beat: their answers are handled in the same passes of the event loop, where the
# same reads spread one by one over the interval cost 1.5-2x the CPU; a beat's burst stays about a
# millisecond, where a hundred engines read together hold every dispatch decision for ten (bench/tools/scrape_scale/).
SCRAPES_PER_BEAT = 10


def scrape_phases(intervals: list[float]) -> list[float]:
    """Where in its interval each of n engines is read: in beats of SCRAPES_PER_BEAT engines, the beats
    spread evenly over the interval (for 100 engines every 0.2 s: 10 beats, 20 ms apart)."""
    beats = math.ceil(len(intervals) / SCRAPES_PER_BEAT)
    return [interval * (k // SCRAPES_PER_BEAT) / beats for k, interval in enumerate(intervals)]


def next_beat(now: float, first_beat: float, interval: float) -> float:
    """The first of the beats `first_beat + m * interval` (m >= 0) after `now`."""
    return first_beat + max(0, math.floor((now - first_beat) / interval) + 1) * interval


class BeatTimer:
    """Sleeps until a deadline on the loop's clock, with one timer for every sleeper of the same deadline
    (engines of one beat compute the same one), armed by the first and cancelled with the last sleeper
    that is itself cancelled. One per event loop's worth of monitors."""

    def __init__(self) -> None:
        self._beats: dict[float, tuple[asyncio.TimerHandle, list[asyncio.Future[None]]]] = {}

    async def sleep_until(self, when: float) -> None:
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        beat = self._beats.get(when)
        if beat is None:
            beat = self._beats[when] = (loop.call_at(when, self._ring, when), [])
        beat[1].append(woken)
        try:
            await woken
        except asyncio.CancelledError:
            self._leave(when, woken)
            raise

    def _ring(self, when: float) -> None:
        _, sleepers = self._beats.pop(when)
        for woken in sleepers:
            if not woken.done():
                woken.set_result(None)

    def _leave(self, when: float, woken: asyncio.Future[None]) -> None:
        """A sleeper cancelled before its beat: the last one's going takes the timer with it."""
        beat = self._beats.get(when)
        if beat is None:
            return
        timer, sleepers = beat
        if woken in sleepers:
            sleepers.remove(woken)
        if not sleepers:
            timer.cancel()
            del self._beats[when]


async def monitor(
    dispatcher: ModelDispatcher,
    handle: BackendHandle,
    clock: Clock,
    metrics: SchedulerMetrics,
    errors: InternalErrors,
    beats: BeatTimer,
    first_beat: float,
) -> None:
    """Read one backend's metrics at once, then on its beats, `first_beat` plus every scrape interval on the
    loop's clock (a read that outlasts the interval skips the beats it missed); stamp each reading with the
    core clock and wake the dispatcher with it."""
    loop = asyncio.get_running_loop()
    was_ok: bool | None = None
    engine = engine_series(metrics, dispatcher.model.name, handle.name)
    while True:
        interval = handle.config.scrape_interval_seconds  # a reload may change it
        if not dispatcher.cluster.authority.scrapes:  # a cluster follower: the leader reads the engine for everyone
            await beats.sleep_until(next_beat(loop.time(), first_beat, interval))
            continue
        try:
            reading = await scrape(handle.backend, clock)
        except Exception as exc:  # an adapter bug must not stop the model: count it as a failed scrape
            errors.report("monitor", exc, model=dispatcher.model.name, backend=handle.name)
            reading = BackendLoad(ok=False, read_at=clock.now(), error=f"{type(exc).__name__}: {exc}")
        handle.record_reading(reading)
        if reading.ok:  # the engine's numbers as last read (a failed scrape leaves the last good ones)
            engine.show(reading)
        else:
            metrics.scrape_failures.labels(dispatcher.model.name, handle.name).inc()
        if reading.ok != was_ok:
            log.info(
                "backend_metrics",
                model=dispatcher.model.name,
                backend=handle.name,
                ok=reading.ok,
                error=reading.error,
            )
            was_ok = reading.ok
        dispatcher.wake()
        await beats.sleep_until(next_beat(loop.time(), first_beat, interval))  # the scrape period

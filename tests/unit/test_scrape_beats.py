"""When the engines are read: in beats of a few engines, spread over the interval, on a fixed grid of the
loop's clock, so a hundred engines neither wake together nor drift into one read per loop pass."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from scheduler_svc.dispatch.monitor import SCRAPES_PER_BEAT, BeatTimer, next_beat, scrape_phases


def test_a_hundred_engines_are_read_in_ten_beats_spread_over_the_interval() -> None:
    phases = scrape_phases([0.2] * 100)
    beats = [list(group) for _, group in itertools.groupby(phases)]
    assert [len(beat) for beat in beats] == [SCRAPES_PER_BEAT] * 10
    assert [beat[0] for beat in beats] == pytest.approx([0.02 * k for k in range(10)])


def test_a_few_engines_share_one_beat_and_an_odd_count_fills_beats_in_order() -> None:
    assert scrape_phases([0.2] * 3) == [0.0, 0.0, 0.0]
    phases = scrape_phases([0.3] * 25)  # three beats: 10, 10, 5 engines, a third of the interval apart
    assert phases == pytest.approx([0.0] * 10 + [0.1] * 10 + [0.2] * 5)
    assert scrape_phases([]) == []


def test_each_engine_is_placed_within_its_own_interval() -> None:
    phases = scrape_phases([0.2] * 10 + [1.0] * 10)
    assert phases[:10] == [0.0] * 10 and phases[10:] == pytest.approx([0.5] * 10)


def test_the_next_beat_is_the_first_grid_point_after_now() -> None:
    assert next_beat(now=100.01, first_beat=100.15, interval=0.2) == pytest.approx(100.15)  # the first beat
    assert next_beat(now=100.15, first_beat=100.15, interval=0.2) == pytest.approx(100.35)  # on a beat: the next
    assert next_beat(now=100.36, first_beat=100.15, interval=0.2) == pytest.approx(100.55)
    # a read that outlasted the interval skips the beats it missed, without a catch-up burst
    assert next_beat(now=101.2, first_beat=100.15, interval=0.2) == pytest.approx(101.35)


def _live_timers(loop: asyncio.AbstractEventLoop) -> int:
    """Timers armed on asyncio's own loop and not cancelled."""
    return sum(1 for handle in getattr(loop, "_scheduled", []) if not handle.cancelled())


async def test_the_sleepers_of_one_beat_wake_at_its_deadline_on_one_timer() -> None:
    loop, beats = asyncio.get_running_loop(), BeatTimer()
    deadline, later = loop.time() + 0.02, loop.time() + 0.04
    woke: list[tuple[int, float]] = []

    async def sleeper(k: int, when: float) -> None:
        await beats.sleep_until(when)
        woke.append((k, loop.time()))

    timers_before = _live_timers(loop)
    sleepers = [asyncio.create_task(sleeper(k, deadline)) for k in range(SCRAPES_PER_BEAT)]
    sleepers.append(asyncio.create_task(sleeper(SCRAPES_PER_BEAT, later)))
    await asyncio.sleep(0)
    assert _live_timers(loop) - timers_before == 2  # one per beat, not one per sleeper
    await asyncio.gather(*sleepers)
    assert [k for k, _ in woke] == list(range(SCRAPES_PER_BEAT + 1))
    assert all(at >= deadline for _, at in woke) and woke[-1][1] >= later


async def test_a_cancelled_sleep_leaves_its_beat_to_the_others_and_the_last_takes_the_timer() -> None:
    loop, beats = asyncio.get_running_loop(), BeatTimer()
    deadline = loop.time() + 0.02
    timers_before = _live_timers(loop)
    first, second = (asyncio.create_task(beats.sleep_until(deadline)) for _ in range(2))
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert _live_timers(loop) - timers_before == 1  # the second still sleeps on it
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert _live_timers(loop) == timers_before  # nobody left: the timer is cancelled, not left to fire
    await beats.sleep_until(loop.time() + 0.01)  # and the deadline's beat can be slept on again

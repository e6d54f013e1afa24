"""When the engines are read: in beats of a few engines, spread over the interval, on a fixed grid of the
loop's clock, so a hundred engines neither wake together nor drift into one read per loop pass."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from scheduler_svc.dispatch.scheduler import SCRAPES_PER_BEAT, _sleep_until, next_beat, scrape_phases


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


async def test_sleeping_until_a_deadline_ends_at_it_and_a_cancelled_sleep_leaves_no_timer() -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 0.02
    await _sleep_until(deadline)
    assert loop.time() >= deadline
    sleeper = asyncio.create_task(_sleep_until(loop.time() + 0.02))
    await asyncio.sleep(0)
    sleeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeper
    scheduled = getattr(loop, "_scheduled", None)  # asyncio's own loop: the timer is cancelled, not left to fire
    assert scheduled is None or all(handle.cancelled() for handle in scheduled)

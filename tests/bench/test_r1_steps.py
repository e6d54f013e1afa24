"""R1 splits a flood's span into the engine's steps and the time each took (bench/scenarios/r1/figures.py)."""

from __future__ import annotations

import pytest

from bench.scenarios.r1.figures import engine_steps
from bench.scenarios.r1.sampling import Sample


def _samples(step_seconds: float, batch: float, until: float) -> list[Sample]:
    """An engine stepping every `step_seconds` with `batch` output tokens a step, sampled every 0.1 s."""
    out = []
    t = 0.0
    while t <= until + 1e-9:
        steps = t / step_seconds
        out.append(Sample(t, waiting=2.0, running=batch, generated=steps * batch, steps=steps))
        t += 0.1
    return out


def test_the_step_series_gives_the_engines_mean_batch_and_time_per_step() -> None:
    got = engine_steps(_samples(0.004, 3.5, 10.0), start=1.0, end=9.0, flood_tokens=7000)
    assert got is not None
    assert got.tokens_per_step == pytest.approx(3.5)
    assert got.seconds_per_step == pytest.approx(0.004)
    assert got.steps == pytest.approx(8.0 / 0.004, rel=0.02)  # only the samples inside the flood count


def test_a_thinner_batch_shows_as_more_steps_at_the_same_step_time() -> None:
    full = engine_steps(_samples(0.004, 4.0, 10.0), 0.0, 10.0, flood_tokens=10_000)
    thin = engine_steps(_samples(0.004, 2.0, 10.0), 0.0, 10.0, flood_tokens=5_000)
    assert full is not None and thin is not None
    assert thin.seconds_per_step == pytest.approx(full.seconds_per_step)
    assert thin.tokens_per_step == pytest.approx(full.tokens_per_step / 2)


def test_an_engine_without_a_step_series_or_steps_reads_none() -> None:
    no_series = [Sample(t / 10, 0.0, 4.0, t * 4.0) for t in range(20)]
    assert engine_steps(no_series, 0.0, 2.0, flood_tokens=0) is None
    stalled = [Sample(t / 10, 0.0, 4.0, 0.0, steps=7.0) for t in range(20)]
    assert engine_steps(stalled, 0.0, 2.0, flood_tokens=0) is None
    assert engine_steps(_samples(0.004, 4.0, 10.0), 20.0, 30.0, flood_tokens=0) is None  # no sample inside


def test_counters_that_lagged_the_flood_read_none() -> None:
    """A starved front end's counters had counted 65% of the flood's tokens by its last sample."""
    samples = _samples(0.004, 4.0, 10.0)
    assert engine_steps(samples, 0.0, 10.0, flood_tokens=10_000) is not None
    assert engine_steps(samples, 0.0, 10.0, flood_tokens=int(10_000 / 0.65)) is None

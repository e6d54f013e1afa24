"""R1 tells a slot read empty between two engine steps from one the engine ran empty, and shows the slots'
phases: whether the flood's first batch filled at once (bench/scenarios/r1/figures.py)."""

from __future__ import annotations

import pytest

from bench.records import RequestRecord
from bench.scenarios.r1.figures import ends_apart, first_fill_spread
from bench.scenarios.r1.setups import SLOTS


def _record(first_token: float | None = None, finished: float | None = None) -> RequestRecord:
    return RequestRecord(user="A", tag="flood", sent=0.0, max_tokens=256, first_token=first_token, finished=finished)


def test_a_first_batch_filled_at_once_has_no_spread_and_one_filled_in_turn_has_its_own() -> None:
    at_once = [_record(0.095) for _ in range(SLOTS)] + [_record(1.5), _record(None)]
    in_turn = [_record(t) for t in (0.073, 0.147, 0.160, 0.160, 1.4, 1.5)]
    assert first_fill_spread(at_once) == pytest.approx(0.0)
    assert first_fill_spread(in_turn) == pytest.approx(0.087)  # the first SLOTS only
    assert first_fill_spread([_record(0.1)] * (SLOTS - 1)) is None  # fewer than a batch started


def test_ends_of_the_same_step_count_once_and_ends_apart_each() -> None:
    waves = [_record(finished=t) for t in (1.0, 1.0005, 1.001, 1.002, 2.0, 2.0004)]
    smeared = [_record(finished=t) for t in (1.0, 1.02, 1.04, 1.06, 2.0, 2.02)]
    assert ends_apart(waves) == pytest.approx(2 / 6)  # two steps ended everything
    assert ends_apart(smeared) == pytest.approx(1.0)  # every end had a step of its own
    assert ends_apart([_record()]) is None

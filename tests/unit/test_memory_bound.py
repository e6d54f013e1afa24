"""Queued requests cost bounded memory, and the caps bound how many there can be."""

from __future__ import annotations

import tracemalloc

import pytest

from scheduler_svc.core.errors import QueueFull
from tests.unit.dispatch_harness import Harness

QUEUED = 100_000


def test_100k_queued_requests_fit_in_a_bounded_footprint_and_the_cap_holds() -> None:
    h = Harness(model={"max_queued": QUEUED, "max_queued_per_user": QUEUED}, cap=0)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(QUEUED):
        h.submit(f"user{i % 1000}", prompt="Summarise the attached report in three sentences.")
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    per_request = used / QUEUED
    print(f"\n{QUEUED} queued requests: {used / 2**20:.1f} MiB, {per_request:.0f} bytes each (scheduler core)")
    assert per_request < 4096
    with pytest.raises(QueueFull):
        h.submit("one-more")
    assert h.queued() == QUEUED

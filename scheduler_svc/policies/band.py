"""Band choice: which backlogged priority class sends the next request, and under whose gate.

A band policy sees the backlogged bands in rank order (read-only) and whether a class's gate is open at
some backend; it answers with a `BandTurn`, or None when nothing may go now. It never touches a queue:
fairness then picks the user within the band, ordering the request within the user's queue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from scheduler_svc.config import PriorityClassConfig
from scheduler_svc.policies.registry import Registry


class BandView(Protocol):
    """What a band policy may read of a band (`queues.Band` is one)."""

    @property
    def priority_class(self) -> PriorityClassConfig: ...

    def oldest_admission(self) -> float:
        """When the band's oldest queued request was admitted, whatever the ordering policy."""
        ...


@dataclass(slots=True)
class BandTurn:
    """The band to serve now (an index into the backlogged bands) and the class whose gate it goes under."""

    index: int
    gate_class: PriorityClassConfig


class BandPolicy(Protocol):
    """Picks the band that sends the next request; may keep state between turns (one instance per model)."""

    def choose(
        self, backlogged: Sequence[BandView], now: float, gate_open: Callable[[PriorityClassConfig], bool]
    ) -> BandTurn | None:
        """`backlogged`: non-empty, best rank first; `gate_open(cls)`: whether some backend admits a
        request of `cls` from a user with nothing at the engines."""
        ...


class StrictRankBands:
    """Strict priority with an anti-starvation guard.

    The best backlogged band decides, and while its gate is closed (even for a user with nothing at the
    engine, the best placed at a priority engine) lower bands wait too (they would only slow it down). A
    lower band whose oldest request has waited longer than its `starvation_after_seconds` sends one request
    under the top band's gate, then the top band gets the next turn, so a starving band gets at most every
    other dispatch. The band's age is its oldest admission whatever the ordering policy.
    """

    def __init__(self) -> None:
        self._promoted_last = False  # the last turn was an anti-starvation promotion

    def choose(
        self, backlogged: Sequence[BandView], now: float, gate_open: Callable[[PriorityClassConfig], bool]
    ) -> BandTurn | None:
        top = backlogged[0].priority_class
        if not gate_open(top):
            return None
        if not self._promoted_last:
            for index, band in enumerate(backlogged[1:], start=1):
                limit = band.priority_class.starvation_after_seconds
                if limit and now - band.oldest_admission() > limit:
                    self._promoted_last = True
                    return BandTurn(index, top)
        self._promoted_last = False
        return BandTurn(0, top)


DEFAULT_BAND_POLICY = "strict_rank"
BAND_POLICIES: Registry[BandPolicy] = Registry("band")
BAND_POLICIES.register(
    DEFAULT_BAND_POLICY,
    StrictRankBands,
    "best-ranked backlogged band first, lower bands wait while its gate is closed; a band starving past "
    "starvation_after_seconds sends every other request under the top band's gate",
)

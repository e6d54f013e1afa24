"""The engine's step time as a function of its running batch, learned from the engine's own readings.

Why a model and not the last reading: a continuous-batching engine gives every running request one token
per step, so its time per output token (TPOT) is its step time, and the step time grows with the batch.
The last reading tells how slow the engine was at the batch it ran during the last scrape interval, not
how slow it will be with one request more. Compared directly with a limit it fails both ways: when a wave
of requests ends, the engine briefly runs a small batch, the reading dips under the limit, and a gate that
trusts it refills every slot at once (measured: 185 ms mean TPOT against a 150 ms limit, every slot busy).
Predicting the TPOT at `batch + 1` from a line fitted to many readings admits exactly what keeps the
engine under the limit, and refills a drained engine at once up to that batch, not beyond.

The model is `step = a + b * batch`, fitted by weighted least squares over every reading that carries a
TPOT, each paired with the mean of the engine's running counts at the two scrapes the TPOT was measured
between. Weights decay with a half-life, so the line follows an engine that gets slower (longer contexts,
another tenant) or faster. Robustness: an interval in which the batch changed a lot counts less, and a
reading far from the line (a GC pause, one huge prefill) is pulled in to three times the line's typical
error before it is added, so one outlier cannot swing the line. Beyond the largest batch seen, the line
is trusted no further than proportional growth from its value there, so a slope fitted on a short ramp
cannot fill the engine in one go.

Until the line is learned (fewer than `MIN_SAMPLES` readings, or batches too close together to tell the
slope from noise, or a fit that says the step gets faster with more work), predictions are conservative
in one stated way: the steepest line with a non-negative fixed cost through the readings' mean point,
`step = mean_tpot * batch / mean_batch` (all of the step time counted as per-request cost). The batch
then grows more slowly than the truth allows, never faster. With no reading at all nothing is predicted
and the gate allows `fallback_max_in_flight` requests, as with stale metrics (see `policies.gate`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from backends.base import BackendLoad

MIN_SAMPLES = 4  # readings before the fitted line is trusted over the conservative proportional one
MIN_BATCH_SPREAD = 0.5  # weighted standard deviation of the batch (requests) needed to trust a slope
OUTLIER_SCALE = 3.0  # a reading further than this many typical errors from the line is pulled in to it
MIN_ERROR_FRACTION = 0.05  # the typical error is never taken below this share of the prediction


@dataclass(frozen=True, slots=True)
class StepFit:
    """A line `step = a + b * batch` and whether it was fitted (True) or is the conservative one.

    Beyond `seen` (the largest batch any reading covered) the line is not trusted further than the
    proportional growth from its value there: a line fitted on a ramp from 4 to 8 must not send the batch
    to 14 in one go on the strength of a slope it has not seen hold.
    """

    a: float
    b: float
    learned: bool
    seen: float = math.inf

    def predict(self, batch: float) -> float:
        line = self.a + self.b * batch
        if batch <= self.seen:
            return line
        return max(line, (self.a + self.b * self.seen) * batch / self.seen)


class StepTimeModel:
    """One engine's step time against its running batch; fed every reading, asked for predictions."""

    def __init__(self, half_life_seconds: float = 30.0) -> None:
        self._half_life = half_life_seconds
        # exponentially decayed weighted sums of 1, x, y, x*x, x*y
        self._w = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self._abs_error = 0.0  # decayed mean absolute error of readings against the line they met
        self._samples = 0
        self._last_at: float | None = None
        self._last_running: int | None = None
        self._seen = 0.0  # the largest batch a reading covered
        self._fit: StepFit | None = None

    @property
    def samples(self) -> int:
        """Readings with a TPOT taken in so far."""
        return self._samples

    def fit(self) -> StepFit | None:
        """The current line, None before the first reading with a TPOT."""
        return self._fit

    def predict(self, batch: int) -> float | None:
        """Predicted seconds per output token with `batch` requests running; None with no data yet."""
        return None if self._fit is None else self._fit.predict(batch)

    def observe(self, reading: BackendLoad) -> None:
        """Take in one scrape; failed scrapes and scrapes without a TPOT only move the running baseline."""
        if not reading.ok:
            self._last_running = None
            return
        previous, self._last_running = self._last_running, reading.running
        tpot = reading.tpot_seconds
        if tpot is None or not math.isfinite(tpot) or tpot <= 0:
            return
        start = reading.running if previous is None else previous
        # tokens came out during the interval, so at least one request ran in it
        batch = max(1.0, (start + reading.running) / 2)
        weight = 1.0 / (1.0 + abs(reading.running - start))
        self._decay_to(reading.read_at)
        self._add(batch, self._pulled_in(batch, tpot), weight)

    def _decay_to(self, at: float) -> None:
        if self._last_at is not None and at > self._last_at and self._half_life > 0:
            keep = 0.5 ** ((at - self._last_at) / self._half_life)
            self._w *= keep
            self._sx *= keep
            self._sy *= keep
            self._sxx *= keep
            self._sxy *= keep
        self._last_at = at if self._last_at is None else max(at, self._last_at)

    def _pulled_in(self, batch: float, tpot: float) -> float:
        """The reading, clipped to OUTLIER_SCALE typical errors around a learned line."""
        fit = self._fit
        if fit is None or not fit.learned:
            return tpot
        predicted = fit.predict(batch)
        bound = OUTLIER_SCALE * max(self._abs_error, MIN_ERROR_FRACTION * predicted)
        error = max(-bound, min(bound, tpot - predicted))
        self._abs_error += 0.2 * (abs(error) - self._abs_error)
        return predicted + error

    def _add(self, x: float, y: float, weight: float) -> None:
        self._seen = max(self._seen, x)
        self._w += weight
        self._sx += weight * x
        self._sy += weight * y
        self._sxx += weight * x * x
        self._sxy += weight * x * y
        self._samples += 1
        self._fit = self._refit()

    def _refit(self) -> StepFit:
        mean_x = self._sx / self._w
        mean_y = self._sy / self._w
        var_x = max(0.0, self._sxx / self._w - mean_x * mean_x)
        if self._samples >= MIN_SAMPLES and var_x >= MIN_BATCH_SPREAD**2:
            b = (self._sxy / self._w - mean_x * mean_y) / var_x
            a = mean_y - b * mean_x
            if a >= 0 and b >= 0:
                return StepFit(a, b, learned=True, seen=self._seen)
        return StepFit(0.0, mean_y / mean_x, learned=False)  # conservative: all of the step is per request

"""What the load generator records per request, and the few statistics the scenarios take from it.

Times are seconds on the monotonic clock relative to the run's start, so the direct and the scheduled run
of a scenario line up on one time axis in the plots.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    """One request as the client saw it."""

    user: str
    tag: str
    sent: float
    max_tokens: int
    first_token: float | None = None
    finished: float | None = None
    tokens: int = 0
    error: str | None = None
    replica: int = 0  # which scheduler replica the call went to (cluster runs; 0 otherwise)
    stream: str = ""  # the closed-loop worker that sent it ("" for a one-off send)
    token_times: list[tuple[float, int]] = field(default_factory=list)  # (when, tokens) per delta
    # the scheduler's own time to first token, from its admission of the request (gRPC runs: its `Finished`
    # timings); the client's TTFT minus this is what the hop through the scheduler cost on either side
    scheduler_ttft: float | None = None
    scheduler_queue_wait: float | None = None  # admission to (last) dispatch: with a failover, the failed try too
    # how long the engine's front end took to take the request in: from sending it to the engine's response
    # headers (a direct client's own figure; through the scheduler, the scheduler's `engine_accept`)
    intake: float | None = None

    def received(self, now: float, tokens: int) -> None:
        """A chunk of `tokens` tokens arrived at `now` (the first one is the request's first token)."""
        if self.first_token is None:
            self.first_token = now
        self.tokens += tokens
        self.token_times.append((now, tokens))

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent

    @property
    def scheduler_hop(self) -> float | None:
        """The client's TTFT minus the scheduler's own: its request's way in and its first token's way out."""
        if self.ttft is None or self.scheduler_ttft is None:
            return None
        return self.ttft - self.scheduler_ttft

    @property
    def completed(self) -> bool:
        return self.finished is not None and self.error is None

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (what the interactive class's limit is about)."""
        if self.finished is None or self.first_token is None or self.tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.tokens - 1)

    def tokens_between(self, start: float, end: float) -> int:
        return sum(n for t, n in self.token_times if start <= t < end)

    def summary(self) -> dict[str, Any]:
        """The raw figures kept in the JSON file (token times are summarised, not stored)."""
        return {
            "user": self.user,
            "tag": self.tag,
            "sent": _round(self.sent),
            "ttft": _round(self.ttft),
            "scheduler_ttft": _round(self.scheduler_ttft),
            "scheduler_queue_wait": _round(self.scheduler_queue_wait),
            "intake": _round(self.intake),
            "finished": _round(self.finished),
            "tokens": self.tokens,
            "max_tokens": self.max_tokens,
            "error": self.error,
            "replica": self.replica,
            "stream": self.stream,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def tokens_by_user(records: Iterable[RequestRecord], start: float, end: float) -> dict[str, int]:
    """Output tokens each user received in [start, end)."""
    out: dict[str, int] = {}
    for record in records:
        out[record.user] = out.get(record.user, 0) + record.tokens_between(start, end)
    return out


def return_gaps(records: Iterable[RequestRecord]) -> dict[str, list[tuple[float, float]]]:
    """Per user, (when its answer ended, seconds until the same closed-loop stream sent again) for every
    answer a stream followed with another request: the client's turnaround, which a policy that waits for a
    returning user (VTC's return grace) must cover."""
    last: dict[str, RequestRecord] = {}
    gaps: dict[str, list[tuple[float, float]]] = {}
    for record in sorted((r for r in records if r.stream), key=lambda r: r.sent):
        previous = last.get(record.stream)
        if previous is not None and previous.finished is not None:
            gaps.setdefault(record.user, []).append((previous.finished, record.sent - previous.finished))
        last[record.stream] = record
    return gaps


def mean_running(records: Iterable[RequestRecord], start: float, end: float) -> dict[str, float]:
    """Per user, the mean number of its requests streaming tokens (first token to end) over [start, end)."""
    out: dict[str, float] = {}
    for record in records:
        if record.first_token is None:
            continue
        stop = record.finished if record.finished is not None else end
        overlap = min(stop, end) - max(record.first_token, start)
        if overlap > 0:
            out[record.user] = out.get(record.user, 0.0) + overlap / (end - start)
    return out


def cumulative_tokens(records: Iterable[RequestRecord], step: float, end: float) -> dict[str, list[int]]:
    """Per user, tokens received up to each multiple of `step` (for the served-tokens-over-time plot)."""
    edges = [step * i for i in range(int(end / step) + 1)]
    per_user: dict[str, list[int]] = {}
    for record in records:
        series = per_user.setdefault(record.user, [0] * len(edges))
        for t, n in record.token_times:
            index = max(0, math.ceil(t / step))
            if index < len(series):
                series[index] += n
    for series in per_user.values():
        for i in range(1, len(series)):
            series[i] += series[i - 1]
    return per_user

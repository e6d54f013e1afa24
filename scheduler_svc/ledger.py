"""What the scheduler sent to one backend, set against the backend's last metrics reading.

Metrics arrive every scrape interval; dispatch decisions happen in between. The ledger remembers which
in-flight requests the last reading cannot have seen yet and which it saw waiting that have since started,
so the gate can act on every first-token or completion event instead of waiting for the next scrape.
"""

from __future__ import annotations

from backends.base import BackendLoad
from scheduler_svc.policies.gate import GateInputs


class DispatchLedger:
    """Per-backend bookkeeping of in-flight requests relative to the latest reading."""

    def __init__(self) -> None:
        self.reading: BackendLoad | None = None
        self.last_failure: BackendLoad | None = None
        self.in_flight = 0
        self._unstarted: dict[str, float] = {}  # request id -> dispatch time, until its first token
        self._started_since_reading = 0

    def dispatched(self, request_id: str, at: float) -> None:
        """A request was sent to the backend at monotonic time `at`."""
        self.in_flight += 1
        self._unstarted[request_id] = at

    def started(self, request_id: str) -> None:
        """The request produced its first token (or ended without one): it is no longer waiting."""
        sent_at = self._unstarted.pop(request_id, None)
        if sent_at is not None and self.reading is not None and sent_at <= self.reading.read_at:
            self._started_since_reading += 1

    def finished(self, request_id: str) -> None:
        """The request is over, whatever the outcome."""
        self.started(request_id)
        self.in_flight -= 1

    def record_reading(self, reading: BackendLoad) -> None:
        """Take in a scrape. A good one replaces the last; a failed one is kept apart, so one lost scrape
        changes nothing while the last good reading simply ages until the gate calls it stale."""
        if not reading.ok:
            self.last_failure = reading
            return
        self.reading = reading
        self._started_since_reading = 0

    def gate_inputs(self, now: float) -> GateInputs:
        read_at = self.reading.read_at if self.reading is not None else float("-inf")
        return GateInputs(
            reading=self.reading,
            now=now,
            in_flight=self.in_flight,
            sent_unseen=sum(1 for at in self._unstarted.values() if at > read_at),
            started_since_reading=self._started_since_reading,
        )

"""One backend's load as the core estimates it: what the scheduler sent, set against the last reading.

One `LoadEstimator` per backend keeps everything a gate decision rests on: the in-flight requests (and how
many each user has there, for engine priorities), the latest metrics reading, and the `GateInputs` built
from both. Readings are stamped with the core's injected clock (`scrape`), the clock every other time here
comes from, so a test on a fake clock sees consistent ages.

Metrics arrive every scrape interval; dispatch decisions happen in between. The ledger tracks each
in-flight request until its first token: whether the engine had accepted it before the last reading was
taken (then the reading may count it as waiting) or not (then the reading cannot show it). With that the
gate can act on every accept, first-token or completion event instead of waiting for the next scrape,
and its estimate of the engine's waiting queue stays an upper bound when we are the engine's only client.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from backends.base import Backend, BackendLoad
from scheduler_svc.core.clock import Clock
from scheduler_svc.dispatch.engine_slots import EngineSlots
from scheduler_svc.policies.gate import GateInputs

# An engine answers the HTTP request a moment before its scheduler holds the request (vLLM starts the
# streaming response, then adds the request to its engine), so a scrape taken just after our "accepted"
# may not count it yet. Only requests accepted this long before a reading count as visible to it; the
# others stay "unseen", which can only over-estimate the queue, never let it run past the target.
VISIBILITY_DELAY = 0.05


def _seen_by(accepted_at: float | None, reading: BackendLoad | None) -> bool:
    """Whether a request accepted at `accepted_at` can be counted in `reading`."""
    return accepted_at is not None and reading is not None and accepted_at <= reading.read_at - VISIBILITY_DELAY


async def scrape(backend: Backend, clock: Clock) -> BackendLoad:
    """Read `backend`'s metrics once, stamped with `clock`'s time taken just before asking: adapters stamp
    with their own `time.monotonic()`, which a fake clock does not follow. Anything dispatched after the
    stamp is still known not to be reflected in the numbers."""
    sent_at = clock.now()
    reading = await backend.load()
    return dataclasses.replace(reading, read_at=sent_at)


class LoadEstimator:
    """Per-backend bookkeeping of in-flight requests relative to the latest good reading.

    A scrape is taken at `read_at` but may answer seconds later (a busy engine front end answers
    `/metrics` slowly). First tokens and ends that happened in between are counted against the reading
    when it arrives, not lost: each event keeps its time, and what the reading could not yet show is
    worked out from `read_at`. With the engine's slot count known, the waiting estimate is also bounded by
    what we have in flight beyond the slots (an engine fills its free slots before it queues), so a late or
    stale reading never holds back work that would go straight into an empty slot.
    """

    def __init__(self, engine_slots: int = 0, *, learn_slots: bool = False) -> None:
        # the engine's batch size: configured, else learned from its readings when `learn_slots`, else 0
        self.slots = EngineSlots(engine_slots, learn=learn_slots)
        self.engine_slots = self.slots.count
        self.reading: BackendLoad | None = None
        self.last_failure: BackendLoad | None = None
        self.in_flight = 0
        self.user_in_flight: dict[str, int] = {}  # user -> its requests in flight here (engine priorities)
        self._user_of: dict[str, str] = {}  # request id -> its user, for those dispatched with one
        # request id -> when the engine accepted it (None: sent, not yet accepted), for all in flight
        self._in_flight: dict[str, float | None] = {}
        self._unstarted: set[str] = set()  # in flight without a first token yet
        self._priority: dict[str, int] = {}  # unstarted requests sent with an engine priority -> it
        self._started_at: dict[str, float] = {}  # in flight with a first token: when it came (if told)
        # (accepted at, first token at, ended at) of requests that ended after the reading's read_at
        self._ended: list[tuple[float | None, float | None, float]] = []
        self._finished_since_reading = 0  # ours the reading could see (accepted before it) that ended since
        self._seen_unstarted_at_reading = 0  # ours the reading may count: accepted before it, not started
        self._started_since_reading = 0  # of those, how many produced a token since
        self._foreign = 0  # requests the reading showed beyond all of ours it could hold: other clients'
        # Kept as events come (recounted at each reading), so a gate decision reads them instead of walking
        # every request in flight: of ours in flight, those the reading cannot show, and of those the unstarted.
        self._unseen = 0
        self._sent_unseen = 0
        self._changed: list[Callable[[], None]] = []
        self._user_count: list[Callable[[str, int], None]] = []

    def watch(self, changed: Callable[[], None], user_count: Callable[[str, int], None]) -> None:
        """Tell `changed()` after every event that may change what a gate decision reads here, and
        `user_count(user, n)` when a user's requests in flight here become `n` (what its engine priority
        rests on)."""
        self._changed.append(changed)
        self._user_count.append(user_count)

    def _tell(self, user: str | None = None) -> None:
        for changed in self._changed:
            changed()
        if user is not None:
            count = self.user_in_flight.get(user, 0)
            for told in self._user_count:
                told(user, count)

    def dispatched(self, request_id: str, engine_priority: int | None = None, user: str | None = None) -> None:
        """A request was handed to the backend (with the engine priority it carries, for priority engines,
        and its user, counted until it finishes)."""
        self.in_flight += 1
        if user is not None:
            self._user_of[request_id] = user
            self.user_in_flight[user] = self.user_in_flight.get(user, 0) + 1
        self._forget_seen(request_id)
        self._in_flight[request_id] = None
        self._unstarted.add(request_id)
        self._unseen += 1
        self._sent_unseen += 1
        if engine_priority is not None:
            self._priority[request_id] = engine_priority
        self._tell(user)

    def accepted(self, request_id: str, at: float) -> None:
        """The engine took the request at monotonic time `at` (its response started)."""
        if request_id in self._in_flight:
            self._forget_seen(request_id)
            self._in_flight[request_id] = at
            self._count_seen(request_id)
            self._tell()

    def started(self, request_id: str, at: float | None = None) -> None:
        """The request produced its first token at `at` (or ended without one): it is no longer waiting.
        Without a time it counts as after the current reading."""
        if request_id not in self._unstarted:
            return
        if not _seen_by(self._in_flight.get(request_id), self.reading):
            self._sent_unseen -= 1
        self._unstarted.discard(request_id)
        self._priority.pop(request_id, None)
        if at is not None:
            self._started_at[request_id] = at
        accepted_at = self._in_flight.get(request_id)
        if _seen_by(accepted_at, self.reading) and _after_reading(at, self.reading):
            self._started_since_reading += 1
        self._tell()

    def finished(self, request_id: str, at: float | None = None) -> None:
        """The request is over at `at`, whatever the outcome."""
        self.started(request_id, at)
        self.in_flight -= 1
        user = self._user_of.pop(request_id, None)
        if user is not None:
            remaining = self.user_in_flight.get(user, 1) - 1
            if remaining:
                self.user_in_flight[user] = remaining
            else:
                self.user_in_flight.pop(user, None)
        self._forget_seen(request_id)
        accepted_at = self._in_flight.pop(request_id, None)
        started_at = self._started_at.pop(request_id, None)
        if at is not None:
            self._ended.append((accepted_at, started_at, at))
        if _seen_by(accepted_at, self.reading) and _after_reading(at, self.reading):
            self._finished_since_reading += 1
        self._tell(user)

    def configure_slots(self, configured: int, *, learn: bool) -> None:
        """The engine's slots as a reloaded config states them (0: learned when `learn`, else unknown)."""
        self.slots.reconfigure(configured, learn)
        self.engine_slots = self.slots.count

    def record_reading(self, reading: BackendLoad) -> None:
        """Take in a scrape. A good one replaces the last; a failed one is kept apart, so one lost scrape
        changes nothing while the last good reading simply ages until the gate calls it stale.

        Events since `read_at` (the scrape may have taken seconds to answer) count against the new reading.
        """
        if not reading.ok:
            self.last_failure = reading
            self._tell()
            return
        learned = self.slots.observe(reading)  # any good reading says something true of the slots, even a late one
        if learned:
            self.engine_slots = self.slots.count
        if self.reading is not None and reading.read_at < self.reading.read_at:
            if learned:  # an older scrape answering after a newer one: only what it taught of the slots counts
                self._tell()
            return
        self.reading = reading
        after = reading.read_at
        self._ended = [e for e in self._ended if e[2] > after]
        seen_unstarted = started_since = finished_since = 0
        for rid, accepted_at in self._in_flight.items():
            if not _seen_by(accepted_at, reading):
                continue
            started_at = self._started_at.get(rid)
            if rid in self._unstarted or (started_at is not None and started_at > after):
                seen_unstarted += 1
                started_since += rid not in self._unstarted
        for accepted_at, started_at, _ in self._ended:
            if not _seen_by(accepted_at, reading):
                continue
            finished_since += 1
            if started_at is not None and started_at > after:
                seen_unstarted += 1
                started_since += 1
        self._seen_unstarted_at_reading = seen_unstarted
        self._started_since_reading = started_since
        self._finished_since_reading = finished_since
        # Of ours, the reading can hold at most those in flight now or ended since it was taken.
        ours = self.in_flight + len(self._ended)
        self._foreign = max(0, reading.running + reading.waiting - ours)
        self._unseen = self._sent_unseen = 0
        for rid in self._in_flight:
            self._count_seen(rid)
        self._tell()

    def _count_seen(self, request_id: str) -> None:
        """Count an in-flight request in the unseen tallies, as the current reading sees it."""
        if not _seen_by(self._in_flight[request_id], self.reading):
            self._unseen += 1
            self._sent_unseen += request_id in self._unstarted

    def _forget_seen(self, request_id: str) -> None:
        """Take an in-flight request out of the unseen tallies (before it changes or leaves)."""
        if request_id in self._in_flight and not _seen_by(self._in_flight[request_id], self.reading):
            self._unseen -= 1
            self._sent_unseen -= request_id in self._unstarted

    def gate_inputs(
        self,
        now: float,
        better_class_active: bool = False,
        *,
        better_tpot_limit: float = 0.0,
        candidate_priority: int | None = None,
        holding_work: bool = False,
    ) -> GateInputs:
        """What a gate decides on at `now`, for a request whose class has better classes active (or not)
        and which would carry `candidate_priority` to a priority engine: the one place they are built."""
        reading = self.reading
        # Some of ours that the reading could have seen were already running without a first token; the
        # first starts are assumed to be those, so the estimate never drops below the truth.
        waiting = reading.waiting if reading is not None else 0
        running_unstarted = max(0, self._seen_unstarted_at_reading - waiting)
        unstarted = len(self._unstarted)
        return GateInputs(
            reading=reading,
            now=now,
            in_flight=self.in_flight,
            sent_unseen=self._sent_unseen,
            started_since_reading=max(0, self._started_since_reading - running_unstarted),
            unseen_in_flight=self._unseen,
            finished_since_reading=self._finished_since_reading,
            engine_slots=self.engine_slots,
            better_class_active=better_class_active,
            started_in_flight=self.in_flight - unstarted,
            waiting_bound=self._waiting_bound(),
            unstarted_priorities=tuple(sorted(self._priority.values())) if self._priority else (),
            unstarted=unstarted,
            better_tpot_limit=better_tpot_limit,
            candidate_priority=candidate_priority,
            holding_work=holding_work,
        )

    def _waiting_bound(self) -> int | None:
        """The most the engine can have waiting, from what we sent alone: everything in flight beyond its
        slots (plus other clients' work the last reading showed). None when it cannot be trusted: slots
        unknown, no reading, the latest scrape failed, or the reading shows waiting work beside free slots
        (an engine that does not fill its batch, e.g. short of KV cache)."""
        reading = self.reading
        if not self.engine_slots or reading is None:
            return None
        if self.last_failure is not None and self.last_failure.read_at > reading.read_at:
            return None
        if reading.waiting > 0 and reading.running < self.engine_slots:
            return None
        return max(0, self.in_flight + self._foreign - self.engine_slots)


def _after_reading(at: float | None, reading: BackendLoad | None) -> bool:
    """Whether an event at `at` happened after `reading` was taken (no time: it happened just now)."""
    return at is None or reading is None or at > reading.read_at

"""How deep a FIFO engine's own queue needs to be: just deep enough to keep its slots busy.

At an engine without priorities (TGI, llama.cpp, vLLM with its FIFO policy) everything queued there is
ahead of whoever arrives next: a latecomer waits for each of them to take a slot before its own turn. The
queue is there only to cover the refill lag: when a slot frees, the engine starts the next request it
holds at once, while the one we send to replace it takes a moment to arrive (our reaction, HTTP, the
engine's intake). One request queued covers that on an engine whose slots free far apart compared with
the lag (measured on real vLLM, 4 slots, mixed lengths: a latecomer's first token 568 ms behind a queue
of 1 against 829 ms behind 3, the same span); a busy front end that takes requests in seconds late needs
more.

So the depth adapts, additive both ways, between 1 and the configured `waiting_target`:
- one more for every reading that shows a free slot and nothing waiting at the engine, once the engine
  has been full, while we held work that the waiting target, not a TPOT or running limit, kept back (the
  queue ran dry before our next request reached it: the engine starved);
- one less after `lower_after` seconds of readings with every slot busy and no such starvation.
Only an unbroken run of readings counts: the gate sees every scrape (`scraped`) but learns from those a
dispatch decision looked at, and a scrape it did not look at (no work held, a failed scrape) starts the
run again, so the time between is never taken for busy slots and an engine filling up from idle (not yet
full in the run) is not starving: the start of a flood does not deepen the queue. A reading counts once.
Without the engine's slot count nothing can be judged and the depth stays at the configured target.
"""

from __future__ import annotations

from backends.base import BackendLoad


class WaitingDepth:
    """The waiting target in force at one FIFO engine, learned from its readings."""

    def __init__(self, ceiling: int, lower_after_seconds: float) -> None:
        self.ceiling = ceiling
        self.target = ceiling  # start where the config says: safe before anything is known
        self._lower_after = lower_after_seconds
        self._scrapes = 0  # scrapes of the engine so far (every one, good or failed)
        self._latest_read_at: float | None = None  # the latest scrape's timestamp
        self._learned_scrape = -1  # the number of the scrape last learned from
        self._busy_since: float | None = None  # start of the run of full, unstarved readings
        self._filled = False  # the engine has had every slot busy in the current run of readings

    @property
    def adaptive(self) -> bool:
        return self._lower_after > 0

    def scraped(self, reading: BackendLoad) -> None:
        """Every scrape of the engine, in order (the gate's `observe`): numbers the readings so that
        `observe` can tell an unbroken run of them from one with scrapes it never looked at."""
        self._scrapes += 1
        self._latest_read_at = reading.read_at

    def observe(self, reading: BackendLoad | None, engine_slots: int, held_by_waiting: bool) -> None:
        """One decision's view of the engine. `held_by_waiting`: we hold work that only the waiting target
        (or nothing at all) kept from the engine, so an empty engine queue beside a free slot is ours to
        fill, not a TPOT or running limit holding work back on purpose."""
        if not self.adaptive or reading is None or not reading.ok or engine_slots <= 0:
            return
        number = self._scrapes if reading.read_at == self._latest_read_at else None
        if number is not None and number == self._learned_scrape:
            return  # this reading was learned from already
        if number is None or number != self._learned_scrape + 1:  # scrapes between went unseen: a new run
            self._busy_since, self._filled = None, False
        self._learned_scrape = -1 if number is None else number
        full = reading.running >= engine_slots
        self._filled = self._filled or full
        if not full and reading.waiting == 0:
            if held_by_waiting and self._filled:
                self.target = min(self.ceiling, self.target + 1)
            self._busy_since = None
            return
        if not full:
            return  # between a finish and the engine's next step: its own queue covers it
        if self._busy_since is None:
            self._busy_since = reading.read_at
        elif reading.read_at - self._busy_since >= self._lower_after:
            self.target = max(1, self.target - 1)
            self._busy_since = reading.read_at

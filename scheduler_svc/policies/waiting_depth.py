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
- one more whenever a reading shows a slot freed since the last reading (that one had every slot busy)
  and nothing waiting at the engine to take it while we held work that the waiting target, not a TPOT or
  running limit, kept back (the queue ran dry before our next request reached it: the engine starved);
- one less after `lower_after` seconds of readings with every slot busy and no such starvation.
An engine filling up from idle is not starving (its last reading was not full), so the start of a flood
does not deepen the queue. A reading counts once (by its timestamp). Without the engine's slot count
nothing can be judged and the depth stays at the configured target.
"""

from __future__ import annotations

from backends.base import BackendLoad


class WaitingDepth:
    """The waiting target in force at one FIFO engine, learned from its readings."""

    def __init__(self, ceiling: int, lower_after_seconds: float) -> None:
        self.ceiling = ceiling
        self.target = ceiling  # start where the config says: safe before anything is known
        self._lower_after = lower_after_seconds
        self._last_read_at: float | None = None
        self._busy_since: float | None = None  # start of the run of full, unstarved readings
        self._was_full = False  # the last reading had every slot busy

    @property
    def adaptive(self) -> bool:
        return self._lower_after > 0

    def observe(self, reading: BackendLoad | None, engine_slots: int, held_by_waiting: bool) -> None:
        """One decision's view of the engine. `held_by_waiting`: we hold work that only the waiting target
        (or nothing at all) kept from the engine, so an empty engine queue beside a free slot is ours to
        fill, not a TPOT or running limit holding work back on purpose."""
        if not self.adaptive or reading is None or not reading.ok or engine_slots <= 0:
            return
        if reading.read_at == self._last_read_at:
            return
        self._last_read_at = reading.read_at
        was_full, self._was_full = self._was_full, reading.running >= engine_slots
        if reading.running < engine_slots and reading.waiting == 0:
            if held_by_waiting and was_full:
                self.target = min(self.ceiling, self.target + 1)
            self._busy_since = None
            return
        if reading.running < engine_slots:
            return  # between a finish and the engine's next step: its own queue covers it
        if self._busy_since is None:
            self._busy_since = reading.read_at
        elif reading.read_at - self._busy_since >= self._lower_after:
            self.target = max(1, self.target - 1)
            self._busy_since = reading.read_at

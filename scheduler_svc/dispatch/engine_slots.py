"""An engine's slot count (its max_num_seqs), learned from its own readings when the config does not say.

Engines do not export how many requests they run at once (vLLM's `cache_config_info` describes the KV
cache, not `--max-num-seqs`; llama.cpp's and TGI's metrics neither), yet the gate needs it: to tell a
request that goes straight into a free slot from one that waits, to adapt a FIFO engine's queue depth, and
to size the queue at a priority engine. Two facts of every continuous-batching engine give it:

- a reading's running count is never above the slot count, so the most requests any reading showed
  running is a lower bound, whatever else was going on;
- an engine that holds waiting requests while its KV cache has room holds them for want of a slot: its
  running count was then at the limit (or one short, read between a finish and the next step).

So once one reading has shown requests waiting beside a KV cache that is not full, the slot count is the
most requests seen running, and it only grows as later readings show more. A lower bound is the safe
side: with fewer slots assumed, more of what was sent counts as waiting, and the gate holds back sooner.
Before such a reading (an engine just started, never saturated) the count stays unknown (0), which the
gate already handles safely: every request without a first token counts as waiting.
"""

from __future__ import annotations

from backends.base import BackendLoad

# KV-cache usage from which waiting requests may be waiting for cache, not for a slot
KV_BOUND_USAGE = 0.9


class EngineSlots:
    """The slot count of one engine: configured, or learned from its readings (0 while unknown)."""

    def __init__(self, configured: int = 0, learn: bool = False) -> None:
        self.reconfigure(configured, learn)
        self._most_running = 0  # the most requests a good reading showed running
        self._saturated = False  # a reading showed work waiting while the KV cache had room

    def reconfigure(self, configured: int, learn: bool) -> None:
        """A reloaded config's slots: what readings showed is still true of the engine, so a count learned
        before stays learned while the config still leaves it to the engine."""
        self._configured = configured
        self._learn = learn and not configured

    @property
    def count(self) -> int:
        """The slots the gate may assume: configured, learned, or 0 (unknown)."""
        if self._configured:
            return self._configured
        return self._most_running if self._learn and self._saturated else 0

    def observe(self, reading: BackendLoad) -> bool:
        """Learn from one reading; True when the count changed."""
        if not self._learn or not reading.ok:
            return False
        before = self.count
        self._most_running = max(self._most_running, reading.running)
        kv_room = reading.kv_cache_usage is None or reading.kv_cache_usage < KV_BOUND_USAGE
        if reading.waiting > 0 and reading.running > 0 and kv_room:
            self._saturated = True
        return self.count != before

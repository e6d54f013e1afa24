"""How often a long answer is read from its engine: tokens that arrive in between leave together.

Every read of an engine's answer costs the scheduler an event-loop pass, an SSE parse, the accounting and
(for a streaming client) one gRPC message or SSE event out, about 0.3 ms of CPU a read. An engine emits
one token per request per step, so reading every token as it arrives costs that much per token. On a CPU
host those cycles come out of the engine's own cores, and on a GPU host out of the core its HTTP front
end and the scheduler share. Past its first `after_tokens` tokens (short answers and every time to first
token are untouched), a run reads its engine at most once per `interval`, on one grid for all runs of
the process, so the runs waiting wake in one loop pass and each read takes every token that arrived
since. A token then reaches its client at most `interval` later; the engine's own pace is not touched
(its socket buffers what is not read yet).

The same allowance goes to the engine with every request that may run past `after_tokens`
(`GenerationRequest.max_token_delay`): one that can group its streamed tokens (vLLM's per-request
`stream_interval`, sized by the adapter from the engine's current time per output token, its first token
always alone) writes one chunk per group, which saves its own front end the per-token work too. Its chunks
then come about `interval` apart and the reads here add no wait; on an engine faster than 16 tokens an
interval (the group's cap), or one that speeds up mid-answer, a token can wait for both: up to about twice
`interval`. A batch that already holds the engine's finish is never held: the end is read at once.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StreamPacing:
    """`interval` seconds between reads of one answer (0: read every token as it arrives), once the answer
    has carried `after_tokens` tokens."""

    interval: float = 0.0
    after_tokens: int = 0
    group_at_engine: bool = True  # also ask the engine to group the tokens it streams (where it can)

    def engine_allowance(self, max_tokens: int) -> float:
        """How late the engine may send a token of an answer of at most `max_tokens` (its own grouping):
        nothing for an answer short enough to be read token by token here, or with engine grouping off."""
        return self.interval if self.group_at_engine and max_tokens > self.after_tokens else 0.0

    def delay(self, tokens_so_far: int, now: float) -> float:
        """Seconds to wait before the next read: up to the next tick of the shared grid, or 0."""
        if self.interval <= 0 or tokens_so_far < self.after_tokens:
            return 0.0
        return (math.floor(now / self.interval) + 1) * self.interval - now

    async def pause(self, tokens_so_far: int) -> None:
        """Wait before the next read of an answer that has carried `tokens_so_far` tokens (cancellable)."""
        loop = asyncio.get_running_loop()
        delay = self.delay(tokens_so_far, loop.time())
        if delay > 0:
            await asyncio.sleep(delay)


NO_PACING = StreamPacing()

"""S7's parameters: the flood, the faults and their times, the cancels, the caps and the storms."""

from __future__ import annotations

from dataclasses import dataclass

from bench.engines import SimProfile

TITLE = "faults"
RUN = "scheduler, caps on"
KILL_CANCEL_MARGIN = 1.0
OUTCOMES = ("completed", "cancelled", "failed", "expired", "rejected")


@dataclass(frozen=True)
class S7Params:
    max_num_seqs: int = 8  # the simulator's slots
    max_tokens: int = 16  # each flood answer
    flood_factor: float = 10.0  # the flood's rate, in multiples of what the engine completes
    flood_seconds: float = 45.0  # how long the flood and the faults last
    flood_users: int = 20  # the flood's users, in turn
    prompt_bytes: int = 3000  # each flood prompt
    kill_at: float = 12.0  # seconds into the flood when the engine is SIGKILLed ...
    restart_after: float = 1.0  # ... and restarted this much later, on the same port
    metrics_down_at: float = 25.0  # seconds into the flood when its metrics go dark ...
    metrics_down_for: float = 10.0  # ... for this long
    queued_cancels: int = 500  # calls cancelled at their first `queued` event
    running_cancels: int = 500  # calls cancelled at their first token
    cancel_tokens: int = 512  # a cancelled call's answer: long, so it is still running when cancelled
    queued_cancel_workers: int = 20  # users cancelling while queued, one call at a time each
    running_cancel_workers: int = 40  # users cancelling while running
    duplicates: int = 50  # second calls reusing a live request id
    oversized: int = 50  # prompts over max_prompt_bytes
    max_queued: int = 1000  # the scheduler's caps: requests queued for the model ...
    max_queued_per_user: int = 20  # ... and per user
    max_prompt_bytes: int = 32 * 1024  # one prompt
    max_queued_bytes: int = 4_000_000  # queued prompt bytes for the model ...
    max_queued_bytes_per_user: int = 64_000  # ... and per user
    per_request_overhead: int = 24 * 1024  # docs/operations.md, sizing: ~24 KB per open Stream call
    per_prompt_byte: float = 3.4  # docs/operations.md, sizing: RSS per queued prompt byte (gRPC's, protobuf's, ours)
    storm_rounds: int = 5  # cancel storms, one after another
    storm_streams: int = 100  # per round, spread over storm_users (each within max_queued_per_user)
    storm_users: int = 5
    storm_tokens: int = 2000  # a storm stream's answer: long, so it is still running when the storm breaks
    storm_prompt_bytes: int = 200
    warmup_seconds: float = 3.0  # of flood before the idle memory reading
    drain_timeout: float = 60.0  # for every call to end after the flood
    channels: int = 8  # gRPC channels the clients spread their calls over

    def profile(self) -> SimProfile:
        return SimProfile(max_num_seqs=self.max_num_seqs)

    def capacity(self) -> float:
        """Requests per second the engine completes with a full batch."""
        p = self.profile()
        return p.max_num_seqs / (self.max_tokens * p.step_seconds(p.max_num_seqs))

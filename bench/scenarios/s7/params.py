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
    max_num_seqs: int = 8
    max_tokens: int = 16
    flood_factor: float = 10.0
    flood_seconds: float = 45.0
    flood_users: int = 20
    prompt_bytes: int = 3000
    kill_at: float = 12.0
    restart_after: float = 1.0
    metrics_down_at: float = 25.0
    metrics_down_for: float = 10.0
    queued_cancels: int = 500
    running_cancels: int = 500
    cancel_tokens: int = 512
    queued_cancel_workers: int = 20
    running_cancel_workers: int = 40
    duplicates: int = 50
    oversized: int = 50
    max_queued: int = 1000
    max_queued_per_user: int = 20
    max_prompt_bytes: int = 32 * 1024
    max_queued_bytes: int = 4_000_000
    max_queued_bytes_per_user: int = 64_000
    per_request_overhead: int = 24 * 1024  # docs/operations.md, sizing: ~24 KB per open Stream call
    per_prompt_byte: float = 3.4  # docs/operations.md, sizing: RSS per queued prompt byte (gRPC's, protobuf's, ours)
    storm_rounds: int = 5
    storm_streams: int = 100  # per round, spread over storm_users (each within max_queued_per_user)
    storm_users: int = 5
    storm_tokens: int = 2000
    storm_prompt_bytes: int = 200
    warmup_seconds: float = 3.0
    drain_timeout: float = 60.0
    channels: int = 8

    def profile(self) -> SimProfile:
        return SimProfile(max_num_seqs=self.max_num_seqs)

    def capacity(self) -> float:
        """Requests per second the engine completes with a full batch."""
        p = self.profile()
        return p.max_num_seqs / (self.max_tokens * p.step_seconds(p.max_num_seqs))

"""The simulator's knobs: one frozen dataclass, validated once when it is built.

Each field is declared with `_field(default, doc)`, so it carries its default and a one-line description
in its metadata (as `scheduler_svc.app.settings` does); the CLI flags and their help text are generated from it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

Flavor = Literal["vllm", "tgi"]
SchedulingPolicy = Literal["fcfs", "priority"]

FLAVORS: tuple[Flavor, ...] = ("vllm", "tgi")
SCHEDULING_POLICIES: tuple[SchedulingPolicy, ...] = ("fcfs", "priority")


def _field(default: Any, doc: str) -> Any:
    """A dataclass field with a default and a one-line description kept in its metadata."""
    return dataclasses.field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class SimConfig:
    """How the simulated engine looks from outside and how fast it runs."""

    flavor: Literal["vllm", "tgi"] = _field("vllm", 'Which engine API to imitate: "vllm" (OpenAI-compatible) or "tgi".')
    model_name: str = _field("sim-model", "Served model name; requests naming another model get a 404.")
    max_num_seqs: int = _field(8, "Most requests in the running batch at once (vLLM --max-num-seqs).")
    scheduling_policy: Literal["fcfs", "priority"] = _field(
        "fcfs", 'Waiting-queue order: "fcfs", or "priority" (vLLM only; lower value first, then arrival).'
    )
    decode_base_ms: float = _field(10.0, "Fixed cost of one engine step in milliseconds.")
    decode_per_seq_ms: float = _field(2.0, "Added step cost per request in the batch, so TPOT grows with it.")
    prefill_per_token_ms: float = _field(
        0.05, "Added step cost per prompt token of each request admitted (prefilled) in that step."
    )
    max_concurrent_requests: int = _field(128, "TGI only: requests in flight beyond this are refused as overloaded.")
    max_num_queued_reqs: int | None = _field(
        None, "vLLM only: refuse new requests with HTTP 503 while this many are waiting (None: unbounded)."
    )
    max_model_len: int = _field(8192, "Context length: prompt tokens + max tokens must fit in it.")
    kv_cache_tokens: int = _field(
        262144, "KV-cache capacity in tokens; running requests beyond it are preempted and recomputed."
    )
    kv_block_size: int = _field(16, "Tokens per KV-cache block; usage is counted in whole blocks.")
    prefix_cache_blocks: int = _field(
        0,
        "Prefix cache capacity in blocks of kv_block_size tokens (LRU, hash-chained as vLLM's): a cached "
        "prompt prefix skips its prefill time and counts in vllm:prefix_cache_hits_total (0: off).",
    )
    keep_alive_seconds: float = _field(
        5.0, "An idle HTTP connection is closed after this long, as vLLM's server does (uvicorn's 5 s)."
    )
    seed: int = _field(0, "Mixed into the output of requests that bring no seed of their own.")
    eos_probability: float = _field(
        0.0, "Chance that each generated token is EOS (0.0: every request runs to its max tokens)."
    )
    journal: str | None = _field(
        None,
        "Append one JSON line per request event (received, started, first token, finished, aborted, failed) "
        "to this file, unbuffered so it survives SIGKILL; a restart appends a boot line (None: no journal).",
    )

    def __post_init__(self) -> None:
        problems = list(_problems(self))
        if problems:
            raise ValueError("invalid simulator config: " + "; ".join(problems))

    @property
    def kv_cache_blocks(self) -> int:
        """Whole KV blocks that fit in `kv_cache_tokens`."""
        return self.kv_cache_tokens // self.kv_block_size


def _problems(config: SimConfig) -> list[str]:
    """Every reason the config cannot run, so one error lists them all."""
    out: list[str] = []
    if config.flavor not in FLAVORS:
        out.append(f"flavor must be one of {', '.join(FLAVORS)}, got {config.flavor!r}")
    if config.scheduling_policy not in SCHEDULING_POLICIES:
        out.append(
            f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {config.scheduling_policy!r}"
        )
    if config.flavor == "tgi" and config.scheduling_policy != "fcfs":
        out.append("TGI has no priority scheduling: use scheduling_policy fcfs with flavor tgi")
    if not config.model_name:
        out.append("model_name must not be empty")
    for name in ("max_num_seqs", "max_concurrent_requests", "max_model_len", "kv_block_size"):
        if getattr(config, name) < 1:
            out.append(f"{name} must be at least 1")
    if config.prefix_cache_blocks < 0:
        out.append("prefix_cache_blocks must not be negative (0: off)")
    for name in ("decode_base_ms", "decode_per_seq_ms", "prefill_per_token_ms"):
        if getattr(config, name) < 0:
            out.append(f"{name} must not be negative")
    if config.keep_alive_seconds <= 0:
        out.append("keep_alive_seconds must be > 0")
    if config.max_num_queued_reqs is not None and config.max_num_queued_reqs < 0:
        out.append("max_num_queued_reqs must not be negative")
    if not 0.0 <= config.eos_probability <= 1.0:
        out.append("eos_probability must be within [0, 1]")
    if config.kv_block_size >= 1 and config.kv_cache_blocks < -(-config.max_model_len // config.kv_block_size):
        out.append("kv_cache_tokens must hold at least one full-length request (max_model_len tokens)")
    return out

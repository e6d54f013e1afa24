"""vLLM's OpenAI-compatible server: streamed generation, numeric priorities, `vllm:*` metrics."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from backends.adapters._adapter import HttpAdapter, queue_counts
from backends.adapters.openai_compat import openai_body, stream_openai
from backends.base import BackendCapabilities, BackendLoad, GenerationEvent, GenerationRequest
from backends.metrics import MetricSamples

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # the second before vLLM 0.10
# time per output token: the inter-token histogram, or its older name before vLLM 0.11
TPOT_HISTOGRAMS = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
CACHE_CONFIG = "vllm:cache_config_info"  # an info gauge: num_gpu_blocks and block_size are labels
MAX_CHUNK_TOKENS = 16  # the most tokens asked for in one streamed chunk


def tokens_per_chunk(max_token_delay: float, tpot_seconds: float | None) -> int:
    """How many tokens vLLM may send together (`stream_interval`) so that the first of a group waits at
    most `max_token_delay`: it waits for the rest of its group, a time per output token each. 1 (every
    token at once) without a delay allowed or a current time per output token."""
    if max_token_delay <= 0 or not tpot_seconds or tpot_seconds <= 0:
        return 1
    return max(1, min(MAX_CHUNK_TOKENS, 1 + int(max_token_delay / tpot_seconds)))


class VllmBackend(HttpAdapter):
    """Adapter for a vLLM server. With `priority_scheduling` (server started with
    `--scheduling-policy priority`) each request carries `priority` (lower is served first)."""

    CAPABILITIES = BackendCapabilities(supports_priority=True, has_tpot=True, has_kv_usage=True)
    # A histogram's _sum and _count only: its buckets would double the parse (about 2.4 ms of CPU a scrape
    # on vLLM's 55 KB /metrics against 1.1 ms, scraped several times a second).
    METRICS = (
        WAITING,
        RUNNING,
        *KV_USAGE,
        *(h + part for h in TPOT_HISTOGRAMS for part in ("_sum", "_count")),
        CACHE_CONFIG,
    )
    SELECT_METRICS_ON_SERVER = True  # its /metrics/ mount is prometheus-client's app: `name[]` works there

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        path, body = openai_body(request, self._engine_model)
        if self._priority_scheduling and request.engine_priority is not None:
            body["priority"] = request.engine_priority
        # Grouped tokens: the engine's front end writes (and the scheduler reads) one chunk per group, not
        # per token; the usage on every chunk tells how many tokens each carried.
        group = tokens_per_chunk(request.max_token_delay, self._tpot.value)
        if group > 1:
            body["stream_interval"] = group
            body["stream_options"]["continuous_usage_stats"] = True
        return stream_openai(self._engine, path, body, request.request_id, request.trace)

    def _parse(self, samples: MetricSamples, read_at: float) -> BackendLoad:
        labels = {"model_name": self._engine_model}
        if samples.total(WAITING, **labels) is None:
            labels = {}  # served under another name: take the whole engine
        waiting, running = queue_counts(samples, WAITING, RUNNING, "is this a vLLM server?", **labels)
        names = next((n for n in TPOT_HISTOGRAMS if samples.has(n + "_count")), TPOT_HISTOGRAMS[0])
        tpot = self._tpot.update(samples.total(names + "_sum", **labels), samples.total(names + "_count", **labels))
        kv = next((v for n in KV_USAGE if (v := samples.maximum(n, **labels)) is not None), None)
        return BackendLoad(
            ok=True,
            read_at=read_at,
            waiting=waiting,
            running=running,
            tpot_seconds=tpot,
            kv_cache_usage=kv,
            cache_tokens=cache_tokens(samples),
        )


def cache_tokens(samples: MetricSamples) -> int | None:
    """Tokens the engine's KV cache holds, from `vllm:cache_config_info` (num_gpu_blocks x block_size, the
    smallest over its engines when several report); None when not exported or not yet known."""
    sizes = []
    for labels in samples.labels(CACHE_CONFIG):
        try:
            blocks, block_size = int(labels.get("num_gpu_blocks", "")), int(labels.get("block_size", ""))
        except ValueError:  # "None" until the engine has profiled its memory
            continue
        if blocks > 0 and block_size > 0:
            sizes.append(blocks * block_size)
    return min(sizes) if sizes else None

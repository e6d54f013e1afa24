"""Prometheus metrics with the real engines' names, fed by the engine's observer callbacks.

Each app gets its own `CollectorRegistry`, never the global one, because tests run several simulators in
one process. Gauges are set from an `EngineSnapshot` at scrape time, so a scrape sees the state of that
instant. vLLM's exposition is prometheus_client's own (vLLM uses it too); TGI's Rust exporter writes
counters without the `_total` suffix and no `_created` series, so `TgiMetrics` renders the text itself.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.utils import floatToGoString

from backends.sim.engine import EngineObserver, EngineSnapshot, FinishReason, SimRequest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Buckets copied from vLLM's PrometheusStatLogger (v1).
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


def _tgi_duration_buckets() -> tuple[float, ...]:
    """TGI's router: 35 geometric buckets from 0.00015, for every metric whose name ends in "duration"."""
    value, buckets = 0.0001, []
    for _ in range(35):
        value *= 1.5
        buckets.append(value)
    return tuple(buckets)


_TGI_DURATION_BUCKETS = _tgi_duration_buckets()

_VLLM_FINISHED_REASON = {
    FinishReason.LENGTH: "length",
    FinishReason.EOS: "stop",
    FinishReason.STOP: "stop",
    FinishReason.ABORT: "abort",
}


class MetricsExporter(EngineObserver, Protocol):
    """An engine observer that can also answer a scrape."""

    def render(self, snapshot: EngineSnapshot, names: Collection[str] = ()) -> bytes:
        """The Prometheus text for one scrape; with `names`, only the samples so called (Prometheus'
        `name[]` selection, where the engine's exposition honours it)."""
        ...


# vLLM 0.32's `vllm:cache_config_info` labels (its CacheConfig fields) with a CPU engine's values; the
# simulator overrides the block size, the block count and whether prefix caching is on.
_VLLM_CACHE_CONFIG = {
    "_block_size_resolved": "True",
    "block_size": "16",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "effective_attention_block_size": "16",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "True",
    "engine": "0",
    "gpu_memory_utilization": "0.92",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_cache_max_concurrency": "None",
    "kv_cache_memory_bytes": "None",
    "kv_cache_size_tokens": "0",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "auto",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": "0",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}


class VllmMetrics:
    """vLLM's metric names; every series is labelled `model_name` and `engine="0"`."""

    def __init__(
        self, model_name: str, *, cache_blocks: int = 0, block_size: int = 16, prefix_caching: bool = False
    ) -> None:
        self.registry = CollectorRegistry()
        self._prefix_counted = (0, 0)  # the engine's prefix-cache (queries, hits) already exported
        reg = self.registry
        names = ["model_name", "engine"]
        values = (model_name, "0")

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=reg).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=reg).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=reg).labels(*values)

        self._running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self._waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self._kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self._prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self._generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self._prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self._prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self._preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        # vLLM's info gauge for its CacheConfig (always 1; the facts are labels, one per CacheConfig field): a
        # prefix stays cached in the KV cache's blocks, so `num_gpu_blocks` is what a router can expect the
        # engine to remember. The label names are vLLM 0.32's own (the conformance test compares them).
        info = {
            **_VLLM_CACHE_CONFIG,
            "block_size": str(block_size),
            "effective_attention_block_size": str(block_size),
            "num_gpu_blocks": str(cache_blocks),
            "kv_cache_size_tokens": str(cache_blocks * block_size),
            "enable_prefix_caching": str(prefix_caching),
            "engine": "0",
        }
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(info), registry=reg).labels(
            **info
        ).set(1)
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=reg,
        )
        # vLLM exports every finished_reason from the start, "error" and "repetition" included (never
        # reached here).
        self._success = {
            reason: success.labels(*values, reason) for reason in ("stop", "length", "abort", "error", "repetition")
        }
        self._ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BUCKETS
        )
        self._itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _TOKEN_LATENCY_BUCKETS,
        )
        self._tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            _TOKEN_LATENCY_BUCKETS,
        )
        self._e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _REQUEST_LATENCY_BUCKETS,
        )
        self._queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            _REQUEST_LATENCY_BUCKETS,
        )

    def on_scheduled(self, request: SimRequest, now: float) -> None:
        """Prefill happens at first admission: count the prompt tokens."""
        self._prompt_tokens.inc(request.params.prompt_tokens)

    def on_preempted(self, request: SimRequest) -> None:
        """Count the preemption."""
        self._preemptions.inc()

    def on_token(self, request: SimRequest, now: float, gap: float | None) -> None:
        """Count the token; the first feeds TTFT, later ones the inter-token latency."""
        self._generation_tokens.inc()
        if gap is None:
            self._ttft.observe(now - request.arrival_time)
        else:
            self._itl.observe(gap)

    def on_finished(self, request: SimRequest, reason: FinishReason, now: float) -> None:
        """Per-request histograms are recorded when a request ends, as vLLM does."""
        self._success[_VLLM_FINISHED_REASON[reason]].inc()
        if reason is FinishReason.ABORT:
            return
        self._e2e.observe(now - request.arrival_time)
        if request.scheduled_at is not None:
            self._queue_time.observe(request.scheduled_at - request.arrival_time)
        if request.num_generated > 1 and request.first_token_at is not None and request.last_token_at is not None:
            decode = request.last_token_at - request.first_token_at
            self._tpot.observe(decode / (request.num_generated - 1))

    def on_step(self, prefill_seconds: float | None, decode_seconds: float, batch_size: int) -> None:
        """vLLM exposes no per-step histogram among the ones simulated."""

    def render(self, snapshot: EngineSnapshot, names: Collection[str] = ()) -> bytes:
        """Set the gauges from `snapshot` and write the registry (only the samples in `names`, if any, as
        prometheus-client's exposition app does for `name[]`)."""
        self._running.set(snapshot.running)
        self._waiting.set(snapshot.waiting)
        self._kv_usage.set(snapshot.kv_cache_usage)
        queries, hits = self._prefix_counted  # the cache counts; the counters catch up at each scrape
        self._prefix_queries.inc(snapshot.prefix_cache_queries - queries)
        self._prefix_hits.inc(snapshot.prefix_cache_hits - hits)
        self._prefix_counted = (snapshot.prefix_cache_queries, snapshot.prefix_cache_hits)
        return generate_latest(self.registry.restricted_registry(names) if names else self.registry)


class TgiMetrics:
    """TGI's metric names (no labels besides `err` and `method`, as TGI's router has none)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self._queue_size = Gauge("tgi_queue_size", "Requests waiting in the queue.", registry=reg)
        self._batch_size = Gauge("tgi_batch_current_size", "Requests in the current batch.", registry=reg)
        self._batch_max_tokens = Gauge(
            "tgi_batch_current_max_tokens", "Most tokens the current batch may hold.", registry=reg
        )
        self._request_count = Counter("tgi_request_count", "Requests received.", registry=reg)
        self._request_success = Counter("tgi_request_success", "Requests completed.", registry=reg)
        self._request_failure = Counter("tgi_request_failure", "Requests failed.", ["err"], registry=reg)
        self._mean_time_per_token = Histogram(
            "tgi_request_mean_time_per_token_duration",
            "Inference time divided by generated tokens, recorded when a request ends.",
            buckets=_TGI_DURATION_BUCKETS,
            registry=reg,
        )
        self._queue_duration = Histogram(
            "tgi_request_queue_duration",
            "Time a request waited before its prefill.",
            buckets=_TGI_DURATION_BUCKETS,
            registry=reg,
        )
        forward = Histogram(
            "tgi_batch_forward_duration",
            "Duration of one forward pass.",
            ["method"],
            buckets=_TGI_DURATION_BUCKETS,
            registry=reg,
        )
        self._forward_prefill = forward.labels("prefill")
        self._forward_decode = forward.labels("decode")

    def request_received(self) -> None:
        """TGI counts every request on arrival, before any check."""
        self._request_count.inc()

    def request_failed(self, err: str) -> None:
        """Count a failure by TGI's `err` label: overloaded, validation, generation, incomplete."""
        self._request_failure.labels(err).inc()

    def on_scheduled(self, request: SimRequest, now: float) -> None:
        """Recorded at the end instead (queue duration)."""

    def on_preempted(self, request: SimRequest) -> None:
        """TGI has no preemption metric."""

    def on_token(self, request: SimRequest, now: float, gap: float | None) -> None:
        """TGI records per-token timing only at request end."""

    def on_finished(self, request: SimRequest, reason: FinishReason, now: float) -> None:
        """Success and the lagging mean time per token, as TGI records them at the end of a request."""
        if reason is FinishReason.ABORT or request.scheduled_at is None:
            return
        self._request_success.inc()
        self._queue_duration.observe(request.scheduled_at - request.arrival_time)
        self._mean_time_per_token.observe((now - request.scheduled_at) / max(1, request.num_generated))

    def on_step(self, prefill_seconds: float | None, decode_seconds: float, batch_size: int) -> None:
        """One forward per step, plus a prefill forward when requests were admitted."""
        if prefill_seconds is not None:
            self._forward_prefill.observe(prefill_seconds)
        self._forward_decode.observe(decode_seconds)

    def render(self, snapshot: EngineSnapshot, names: Collection[str] = ()) -> bytes:
        """Set the gauges and write text the way TGI's exporter does (which has no selection: `names` is
        not served, `ControlApi` offers no selecting route for TGI)."""
        self._queue_size.set(snapshot.waiting)
        self._batch_size.set(snapshot.running)
        self._batch_max_tokens.set(snapshot.batch_max_tokens)
        lines: list[str] = []
        for family in self.registry.collect():
            samples = [s for s in family.samples if not s.name.endswith("_created")]
            if not samples:
                continue
            lines.append(f"# TYPE {family.name} {family.type}")
            for sample in samples:
                name = family.name if sample.name == family.name + "_total" else sample.name
                lines.append(f"{name}{_labels(sample.labels)} {_value(sample.value)}")
            lines.append("")
        return "\n".join(lines).encode()


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items()) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(value: float) -> str:
    """Integral values without a fraction, as TGI's Rust exporter prints counters."""
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]

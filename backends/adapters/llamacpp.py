"""llama.cpp's `llama-server`: OpenAI-compatible streaming and `llamacpp:*` metrics; no priorities.

Start the server with `--metrics` (and `-np N --cont-batching` for N parallel slots). It closes the
connection after every streamed response although it announces keep-alive, so connections are never
reused (force_close), or every other request would fail on a dead socket.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from backends.adapters._adapter import HttpAdapter, queue_counts
from backends.adapters.openai_compat import openai_body, stream_openai
from backends.base import BackendCapabilities, BackendLoad, GenerationEvent, GenerationRequest
from backends.metrics import MetricSamples

WAITING = "llamacpp:requests_deferred"  # requests waiting for a free slot
RUNNING = "llamacpp:requests_processing"
# cumulative seconds spent generating and tokens generated: their deltas give time per output token
TPOT_SECONDS = "llamacpp:tokens_predicted_seconds_total"
TPOT_TOKENS = "llamacpp:tokens_predicted_total"
KV_USAGE = "llamacpp:kv_cache_usage_ratio"  # present in some versions only


class LlamaCppBackend(HttpAdapter):
    """Adapter for llama.cpp's server: pure gating."""

    CAPABILITIES = BackendCapabilities(supports_priority=False, has_tpot=True, has_kv_usage=False)
    FORCE_CLOSE = True
    METRICS = (WAITING, RUNNING, TPOT_SECONDS, TPOT_TOKENS, KV_USAGE)

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        path, body = openai_body(request, self._engine_model)
        return stream_openai(self._engine, path, body, request.request_id, request.trace)

    def _parse(self, samples: MetricSamples, read_at: float) -> BackendLoad:
        waiting, running = queue_counts(samples, WAITING, RUNNING, "was llama-server started with --metrics?")
        tpot = self._tpot.update(samples.total(TPOT_SECONDS), samples.total(TPOT_TOKENS))
        kv = samples.maximum(KV_USAGE)
        return BackendLoad(
            ok=True, read_at=read_at, waiting=waiting, running=running, tpot_seconds=tpot, kv_cache_usage=kv
        )

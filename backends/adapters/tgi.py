"""HuggingFace Text Generation Inference: `/generate_stream` SSE and `tgi_*` metrics; no priorities.

TGI reports errors INSIDE the event stream, possibly after HTTP 200 (`{"error": ..., "error_type": ...}`),
so every event is checked. Chat requests go to its OpenAI-compatible `/v1/chat/completions`.
Its time-per-token histogram is recorded only when a request ends, so the TPOT signal lags.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp

from backends.adapters._adapter import HttpAdapter, queue_counts
from backends.adapters._sse import iter_sse_batches
from backends.adapters.openai_compat import openai_body, stream_openai
from backends.base import (
    Accepted,
    BackendCapabilities,
    BackendLoad,
    Finished,
    GenerationEvent,
    GenerationRequest,
    TextDelta,
)
from backends.errors import (
    BackendError,
    BackendOverloaded,
    BackendProtocolError,
    BackendRejectedRequest,
    BackendUnavailable,
)
from backends.http import stream_failure
from backends.metrics import MetricSamples

WAITING = "tgi_queue_size"
RUNNING = "tgi_batch_current_size"
TPOT_HISTOGRAM = "tgi_request_mean_time_per_token_duration"
_FINISH_REASONS = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}


def tgi_body(request: GenerationRequest) -> dict[str, Any]:
    """The `/generate_stream` body. TGI rejects temperature <= 0 and top_p outside (0, 1): those mean
    greedy / no nucleus sampling, so they are left out instead of sent."""
    params = request.params
    parameters: dict[str, Any] = {"max_new_tokens": params.max_tokens, "details": True}
    if params.temperature is not None and params.temperature > 0:
        parameters["temperature"] = params.temperature
        parameters["do_sample"] = True
    if params.top_p is not None and 0 < params.top_p < 1:
        parameters["top_p"] = params.top_p
    if params.seed is not None:
        parameters["seed"] = params.seed
    if params.stop:
        parameters["stop"] = list(params.stop)
    if params.frequency_penalty is not None:  # /generate_stream has no presence_penalty
        parameters["frequency_penalty"] = params.frequency_penalty
    return {"inputs": request.prompt, "parameters": parameters}


def _stream_error(event: dict[str, Any], backend: str) -> BackendError:
    message = f"engine {backend} reported {event.get('error_type', 'an error')}: {event.get('error')}"
    kind = event.get("error_type")
    if kind == "overloaded":
        return BackendOverloaded(message, backend=backend)
    if kind == "validation":
        return BackendRejectedRequest(message, backend=backend)
    return BackendUnavailable(message, backend=backend)


class TgiBackend(HttpAdapter):
    """Adapter for a TGI server: pure gating, no priorities."""

    CAPABILITIES = BackendCapabilities(supports_priority=False, has_tpot=True, has_kv_usage=False)
    METRICS = (WAITING, RUNNING, TPOT_HISTOGRAM + "_sum", TPOT_HISTOGRAM + "_count")  # not the buckets

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        if request.messages is not None:
            path, body = openai_body(request, self._engine_model)
            return stream_openai(self._engine, path, body, request.request_id, request.trace)
        return self._generate_stream(request)

    async def _generate_stream(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        name = self._engine.name
        details: dict[str, Any] | None = None
        tokens = 0
        # Closed on any early end, the yield of Accepted included: that aborts the request in the engine.
        async with self._engine.streaming(
            "/generate_stream", tgi_body(request), request.request_id, request.trace
        ) as response:
            yield Accepted()
            try:
                async for batch in iter_sse_batches(response):
                    texts: list[str] = []
                    failure: BackendError | None = None
                    for data in batch:
                        try:
                            event = json.loads(data)
                        except ValueError as exc:
                            raise BackendProtocolError(f"engine {name} sent {data[:200]!r}", backend=name) from exc
                        if "error" in event:
                            failure = _stream_error(event, name)
                            break
                        token = event.get("token") or {}
                        if token and not token.get("special"):
                            tokens += 1
                            texts.append(token.get("text") or "")
                        if event.get("details"):
                            details = event["details"]
                    if texts:  # tokens that arrived together leave together
                        yield TextDelta("".join(texts), tokens=len(texts), last=details is not None)
                    if failure is not None:
                        raise failure
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise stream_failure(exc, name) from exc
            if details is None:
                raise BackendUnavailable(f"engine {name} ended the stream without details", backend=name)
        yield Finished(
            finish_reason=_FINISH_REASONS.get(details.get("finish_reason", ""), "stop"),
            prompt_tokens=details.get("input_length"),
            completion_tokens=int(details.get("generated_tokens", tokens)),
        )

    def _parse(self, samples: MetricSamples, read_at: float) -> BackendLoad:
        waiting, running = queue_counts(samples, WAITING, RUNNING, "is this a TGI server?")
        tpot = self._tpot.update(samples.total(TPOT_HISTOGRAM + "_sum"), samples.total(TPOT_HISTOGRAM + "_count"))
        return BackendLoad(ok=True, read_at=read_at, waiting=waiting, running=running, tpot_seconds=tpot)

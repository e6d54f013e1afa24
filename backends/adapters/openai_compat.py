"""Streaming generation over the OpenAI-compatible API that vLLM, llama.cpp's server and TGI all speak."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp

from backends.adapters._sse import iter_sse_batches
from backends.base import Accepted, Finished, GenerationEvent, GenerationRequest, TextDelta, TraceContext
from backends.errors import BackendProtocolError, BackendUnavailable
from backends.http import HttpEngine, error_message, stream_failure

_FINISH_REASONS = {"stop": "stop", "length": "length", "eos": "stop", "eos_token": "stop"}


def openai_body(request: GenerationRequest, engine_model: str) -> tuple[str, dict[str, Any]]:
    """The endpoint path and JSON body for a streamed completion or chat completion."""
    params = request.params
    body: dict[str, Any] = {
        "model": engine_model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": params.max_tokens,
    }
    if request.messages is not None:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": m.role, "content": m.content} for m in request.messages]
    else:
        path = "/v1/completions"
        body["prompt"] = request.prompt
    if params.temperature is not None:
        body["temperature"] = params.temperature
    if params.top_p is not None:
        body["top_p"] = params.top_p
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.ignore_eos:
        body["ignore_eos"] = True
    if params.presence_penalty is not None:
        body["presence_penalty"] = params.presence_penalty
    if params.frequency_penalty is not None:
        body["frequency_penalty"] = params.frequency_penalty
    return path, body


async def stream_openai(
    engine: HttpEngine, path: str, body: dict[str, Any], request_id: str, trace: TraceContext | None = None
) -> AsyncGenerator[GenerationEvent, None]:
    """POST a streaming request and turn its SSE chunks into Accepted, TextDelta ... Finished.

    Leaving the iterator early (client cancelled) at any of its yields, `Accepted` included, closes the
    connection, which makes the engine abort the request and free its slot and KV cache.
    """
    chat = path.endswith("/chat/completions")
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    counted = 0  # tokens reported in TextDeltas so far
    async with engine.streaming(path, body, request_id, trace) as response:
        yield Accepted()
        try:
            done = False
            failure: BackendUnavailable | None = None
            async for batch in iter_sse_batches(response):
                texts: list[str] = []
                for data in batch:
                    if data.strip() == "[DONE]":
                        done = True
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError as exc:
                        raise BackendProtocolError(
                            f"engine {engine.name} sent a malformed chunk: {data[:200]!r}", backend=engine.name
                        ) from exc
                    if "error" in chunk or chunk.get("object") == "error":
                        failure = BackendUnavailable(
                            f"engine {engine.name} failed mid-stream: {error_message(data)}", backend=engine.name
                        )
                        break
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices") or []:
                        text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                        if text:
                            texts.append(text)
                        if choice.get("finish_reason"):
                            finish_reason = choice["finish_reason"]
                if texts:  # what arrived together leaves together: one delta, one gRPC message
                    # a chunk's text may hold several tokens (vLLM's stream_interval, a busy engine's
                    # merge): the usage so far, where the chunks carry it, says how many
                    tokens = len(texts)
                    if usage is not None and int(usage.get("completion_tokens") or 0) > counted:
                        tokens = int(usage["completion_tokens"]) - counted
                    counted += tokens
                    yield TextDelta("".join(texts), tokens=tokens, last=finish_reason is not None)
                if failure is not None:
                    raise failure
                if done:
                    break
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise stream_failure(exc, engine.name) from exc
        if finish_reason is None:
            raise BackendUnavailable(f"engine {engine.name} ended the stream without finishing", backend=engine.name)
        if finish_reason not in _FINISH_REASONS:
            raise BackendUnavailable(
                f"engine {engine.name} ended the request with finish_reason={finish_reason!r}",
                backend=engine.name,
            )
    yield Finished(
        finish_reason=_FINISH_REASONS[finish_reason],
        prompt_tokens=int(usage["prompt_tokens"]) if usage and "prompt_tokens" in usage else None,
        completion_tokens=int(usage["completion_tokens"]) if usage and "completion_tokens" in usage else counted,
    )

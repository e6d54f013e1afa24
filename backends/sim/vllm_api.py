"""The vLLM flavour's HTTP routes: completions, chat completions, models and health.

Streaming follows vLLM's server: one `data: {json}\\n\\n` chunk per generated token (the last carries the
last token's text with `finish_reason`, and `system_fingerprint` when no usage chunk follows), an optional
usage chunk (`choices: []`, `usage`, `system_fingerprint`), then `data: [DONE]\\n\\n`. An error after the
stream started is one `data: {"error": {...}}` chunk followed by `[DONE]`, as vLLM's serving code yields it.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from backends.sim.config import SimConfig
from backends.sim.engine import RequestHandle, SimEngine
from backends.sim.faults import Faults
from backends.sim.streaming import ClientGone, StreamFault, dumps, injected_refusal, open_event_stream, token_events
from backends.sim.tokens import StopBufferedText
from backends.sim.vllm_protocol import (
    ApiError,
    ChunkWriter,
    Kind,
    ParsedRequest,
    error_body,
    finish_fields,
    models_list,
    new_response_id,
    parse_request,
    system_fingerprint,
    usage,
)

_INJECTED_ERROR = "Simulated engine failure (fault injection)"


def _raw_prompt(body: object) -> object:
    """The request's prompt (or first message's content) as sent, for the journal's tag; None if absent."""
    if not isinstance(body, dict):
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    messages = body.get("messages")
    if prompt is None and isinstance(messages, list) and messages and isinstance(messages[0], dict):
        prompt = messages[0].get("content")
    return prompt


def _json(payload: object, status: int = 200) -> web.Response:
    """JSON as vLLM (FastAPI) sends it: `Content-Type: application/json`, no charset parameter."""
    return web.Response(body=dumps(payload).encode(), status=status, content_type="application/json")


class VllmApi:
    """Handlers bound to one engine and its faults."""

    def __init__(self, config: SimConfig, engine: SimEngine, faults: Faults) -> None:
        self._config = config
        self._engine = engine
        self._faults = faults
        self._fingerprint = system_fingerprint(config)

    def add_routes(self, app: web.Application) -> None:
        """Register vLLM's endpoints on `app` (`/health`, the same for both engines, is `create_app`'s)."""
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)

    async def models(self, request: web.Request) -> web.Response:
        """The one served model."""
        return _json(models_list(self._config))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/completions`."""
        return await self._generate(request, "completion")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/chat/completions`."""
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        header_id = request.headers.get("X-Request-Id")
        refusal = await injected_refusal(self._faults, self._engine, header_id)
        if refusal is not None:
            status, message = refusal
            return _json(error_body(status, message), status)
        try:
            body = await request.json()
        except ValueError as exc:
            self._engine.journal_refused(header_id, None, 400, "invalid JSON body")
            return _json(error_body(400, f"Invalid JSON body: {exc}"), 400)
        try:
            parsed = parse_request(kind, body, self._config)
        except ApiError as exc:
            self._engine.journal_refused(header_id, _raw_prompt(body), exc.status, exc.message)
            return _json(exc.body(), exc.status)
        limit = self._config.max_num_queued_reqs
        if limit is not None and self._engine.num_waiting >= limit:
            self._engine.note_rejected()
            message = f"The engine's waiting queue is full (max_num_queued_reqs={limit})."
            self._engine.journal_refused(header_id, parsed.params.prompt, 503, message)
            return _json(error_body(503, message), 503)

        writer = ChunkWriter(kind, new_response_id(kind, header_id), self._config.model_name, self._fingerprint)
        handle = self._engine.add_request(header_id or writer.response_id, parsed.params, x_request_id=header_id)
        try:
            if self._faults.answer_delay_ms:
                await asyncio.sleep(self._faults.answer_delay_ms / 1000)  # the injected delay itself
            if parsed.stream:
                return await self._stream(request, handle, parsed, writer)
            return await self._respond(request, handle, writer)
        except ClientGone:
            return web.Response(status=499)  # nobody is left to read it
        finally:
            handle.abort("client disconnected")  # a no-op when the request already ended

    async def _stream(
        self, request: web.Request, handle: RequestHandle, parsed: ParsedRequest, writer: ChunkWriter
    ) -> web.StreamResponse:
        response = await open_event_stream(request, "text/event-stream; charset=utf-8")

        async def send(payload: object) -> None:
            await response.write(f"data: {dumps(payload)}\n\n".encode())

        buffer = StopBufferedText(parsed.params.stop)
        tokens_sent = 0  # tokens generated for this stream so far (continuous usage counts these)
        held, held_tokens, chunks = "", 0, 0  # text not sent yet under stream_interval, and its tokens
        try:
            prompt_tokens = handle.request.params.prompt_tokens

            def usage_so_far(completion_tokens: int) -> dict[str, object]:
                """`continuous_usage_stats`: vLLM's chat chunks also name completion_tokens_details."""
                so_far: dict[str, object] = {**usage(prompt_tokens, completion_tokens)}
                if writer.kind == "chat":
                    so_far["completion_tokens_details"] = None
                return so_far

            if writer.kind == "chat":
                role = writer.role_chunk()
                if parsed.continuous_usage:
                    role["usage"] = usage_so_far(0)
                await send(role)
            async for event in token_events(request, handle, self._faults):
                if event is StreamFault.CUT:
                    return response
                if event is StreamFault.ERROR:
                    await send(error_body(500, _INJECTED_ERROR))
                    break
                piece = "" if event.token.special else event.token.text
                finish_reason = stop_reason = None
                if event.finished is None:
                    held += buffer.push(piece)
                else:
                    held += buffer.finish(piece, event.finished.stop_at)
                    finish_reason, stop_reason = finish_fields(event.finished.reason, event.finished.stop_string)
                tokens_sent += 1
                held_tokens += 1
                # vLLM's rule: the first token at once, then every stream_interval tokens, and the last at once
                if event.finished is not None or chunks == 0 or held_tokens >= parsed.stream_interval:
                    chunk = writer.delta_chunk(held, finish_reason, stop_reason, usage_follows=parsed.include_usage)
                    if parsed.continuous_usage:
                        chunk["usage"] = usage_so_far(tokens_sent)
                    await send(chunk)
                    held, held_tokens, chunks = "", 0, chunks + 1
                if event.finished is not None and parsed.include_usage:
                    fin = event.finished
                    await send(writer.usage_chunk(fin.prompt_tokens, fin.completion_tokens))
            await response.write(b"data: [DONE]\n\n")
        except (ClientGone, ConnectionResetError):
            handle.abort("client disconnected")
        return response

    async def _respond(self, request: web.Request, handle: RequestHandle, writer: ChunkWriter) -> web.StreamResponse:
        async for event in token_events(request, handle, self._faults):
            if event is StreamFault.CUT:
                return web.Response(status=500)
            if event is StreamFault.ERROR:
                return _json(error_body(500, _INJECTED_ERROR), 500)
            fin = event.finished
            if fin is not None:
                finish_reason, stop_reason = finish_fields(fin.reason, fin.stop_string)
                text = handle.request.text if fin.stop_at is None else handle.request.text[: fin.stop_at]
                return _json(
                    writer.full_response(text, finish_reason, stop_reason, fin.prompt_tokens, fin.completion_tokens)
                )
        raise AssertionError("engine events ended without a last token")  # pragma: no cover

"""The TGI flavour's HTTP routes: generate, generate_stream, health and info.

As in TGI's router, `/generate_stream` always answers HTTP 200 and reports every failure that happens
after parsing (overload, validation, generation) as an event `data:{"error": ..., "error_type": ...}`
inside the stream; `/generate` answers 429 / 422 / 424 instead. The last stream event carries
`generated_text`, and `details` only when the request asked for `"details": true` (TGI's default is false).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from attrs import define, field

from backends.sim.body_fields import BodyFields
from backends.sim.config import SimConfig
from backends.sim.engine import FinishReason, GenerateParams, RequestHandle, SimEngine
from backends.sim.faults import Faults
from backends.sim.metrics import TgiMetrics
from backends.sim.streaming import ClientGone, StreamFault, dumps, injected_refusal, open_event_stream, token_events
from backends.sim.tokens import Token, count_tokens

_MAX_STOP_SEQUENCES = 4  # TGI's --max-stop-sequences default
_INJECTED_ERROR = "Request failed during generation: Simulated engine failure (fault injection)"

_FINISH_REASON = {
    FinishReason.LENGTH: "length",
    FinishReason.EOS: "eos_token",
    FinishReason.STOP: "stop_sequence",
}


class TgiError(Exception):
    """A failure TGI reports as `{"error", "error_type"}`; `status` applies outside streams."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message

    def body(self) -> dict[str, str]:
        """TGI's `ErrorResponse`."""
        return {"error": self.message, "error_type": self.error_type}


def _overloaded() -> TgiError:
    return TgiError(429, "overloaded", "Model is overloaded")


def _invalid(message: str) -> TgiError:
    return TgiError(422, "validation", f"Input validation error: {message}")


_FIELDS = BodyFields(lambda name, what: _invalid(f"`{name}` must be {what}"))


@dataclass(frozen=True, slots=True)
class _TgiRequest:
    params: GenerateParams
    details: bool
    prefix: str  # the prompt, when return_full_text asks for it in generated_text


def _parse(body: Any, config: SimConfig) -> _TgiRequest:
    """Validate a `/generate(_stream)` body the way TGI's validation does; raises `TgiError`."""
    if not isinstance(body, Mapping):
        raise _invalid("request body must be a JSON object")
    inputs = body.get("inputs")
    if not isinstance(inputs, str):
        raise _invalid("`inputs` must be a string")
    if not inputs:
        raise _invalid("`inputs` cannot be empty")
    params = body.get("parameters") or {}
    if not isinstance(params, Mapping):
        raise _invalid("`parameters` must be an object")

    max_new_tokens = _FIELDS.integer(params, "max_new_tokens")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise _invalid("`max_new_tokens` must be strictly positive")
    temperature = _FIELDS.number(params, "temperature")
    if temperature is not None and temperature <= 0:
        raise _invalid("`temperature` must be strictly positive")
    top_p = _FIELDS.number(params, "top_p")
    if top_p is not None and not 0 < top_p < 1:
        raise _invalid("`top_p` must be > 0.0 and < 1.0")
    stop = params.get("stop") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise _invalid("`stop` must be a list of strings")
    if len(stop) > _MAX_STOP_SEQUENCES:
        raise _invalid(f"`stop` supports up to {_MAX_STOP_SEQUENCES} stop sequences. Given: {len(stop)}")
    seed = _FIELDS.integer(params, "seed")
    if seed is not None and seed < 0:
        raise _invalid("`seed` must be a non-negative integer")

    input_length = count_tokens(inputs)
    max_total = config.max_model_len
    if input_length >= max_total:
        raise _invalid(f"`inputs` must have less than {max_total} tokens. Given: {input_length}")
    if max_new_tokens is None:
        max_new_tokens = max_total - input_length
    if input_length + max_new_tokens > max_total:
        raise _invalid(
            f"`inputs` tokens + `max_new_tokens` must be <= {max_total}. "
            f"Given: {input_length} `inputs` tokens and {max_new_tokens} `max_new_tokens`"
        )
    return _TgiRequest(
        params=GenerateParams(
            prompt=inputs,
            prompt_tokens=input_length,
            max_tokens=max_new_tokens,
            stop=tuple(stop),
            seed=seed,
        ),
        details=params.get("details") is True,
        prefix=inputs if params.get("return_full_text") is True else "",
    )


def _token_json(token: Token) -> dict[str, Any]:
    return {"id": token.id, "text": token.text, "logprob": token.logprob, "special": token.special}


def _json(payload: object, status: int = 200) -> web.Response:
    return web.Response(text=dumps(payload), status=status, content_type="application/json")


@define(eq=False)
class TgiApi:
    """Handlers bound to one engine, its faults and TGI's metrics."""

    _config: SimConfig
    _engine: SimEngine
    _faults: Faults
    _metrics: TgiMetrics
    _in_flight: int = field(init=False, default=0)

    def add_routes(self, app: web.Application) -> None:
        """Register TGI's endpoints on `app` (`/health`, the same for both engines, is `create_app`'s)."""
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/generate_stream", self.generate_stream)
        app.router.add_get("/info", self.info)

    async def info(self, request: web.Request) -> web.Response:
        """TGI's `/info`, with the limits this simulator enforces."""
        cfg = self._config
        return _json(
            {
                "model_id": cfg.model_name,
                "model_sha": None,
                "model_pipeline_tag": "text-generation",
                "max_concurrent_requests": cfg.max_concurrent_requests,
                "max_best_of": 1,
                "max_stop_sequences": _MAX_STOP_SEQUENCES,
                "max_input_tokens": cfg.max_model_len - 1,
                "max_total_tokens": cfg.max_model_len,
                "validation_workers": 1,
                "max_client_batch_size": 1,
                "router": "text-generation-router",
                "version": "sim",
                "sha": None,
                "docker_label": None,
            }
        )

    async def _read(self, request: web.Request) -> tuple[Any, web.Response | None]:
        """Count the request, apply injected rejection, parse JSON; a response means 'answer this'."""
        self._metrics.request_received()
        refusal = await injected_refusal(self._faults, self._engine, request.headers.get("X-Request-Id"))
        if refusal is not None:
            status, message = refusal
            error_type = {429: "overloaded", 422: "validation"}.get(status, "generation")
            return None, _json({"error": message, "error_type": error_type}, status)
        try:
            body = await request.json()
        except ValueError as exc:
            self._metrics.request_failed("validation")
            message = f"Failed to parse the request body as JSON: {exc}"
            return None, _json({"error": message, "error_type": "validation"}, 422)
        return body, None

    def _admit(self, request: web.Request, body: Any) -> _TgiRequest:
        """TGI's order: the concurrency permit first, then validation."""
        try:
            if self._in_flight >= self._config.max_concurrent_requests:
                self._engine.note_rejected()
                self._metrics.request_failed("overloaded")
                raise _overloaded()
            try:
                return _parse(body, self._config)
            except TgiError:
                self._metrics.request_failed("validation")
                raise
        except TgiError as exc:
            inputs = body.get("inputs") if isinstance(body, dict) else None
            self._engine.journal_refused(request.headers.get("X-Request-Id"), inputs, exc.status, str(exc))
            raise

    def _start(self, request: web.Request, parsed: _TgiRequest) -> RequestHandle:
        header_id = request.headers.get("X-Request-Id")
        return self._engine.add_request(header_id or f"tgi-{uuid.uuid4().hex}", parsed.params, x_request_id=header_id)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """`POST /generate`: the whole text at once."""
        body, early = await self._read(request)
        if early is not None:
            return early
        try:
            parsed = self._admit(request, body)
        except TgiError as exc:
            return _json(exc.body(), exc.status)
        self._in_flight += 1
        handle = self._start(request, parsed)
        tokens: list[Token] = []
        try:
            async for event in token_events(request, handle, self._faults):
                if event is StreamFault.CUT:
                    return web.Response(status=500)
                if event is StreamFault.ERROR:
                    self._metrics.request_failed("generation")
                    return _json({"error": _INJECTED_ERROR, "error_type": "generation"}, 424)
                tokens.append(event.token)
                fin = event.finished
                if fin is not None:
                    payload: dict[str, Any] = {"generated_text": parsed.prefix + handle.request.text}
                    if parsed.details:
                        payload["details"] = {
                            "finish_reason": _FINISH_REASON[fin.reason],
                            "generated_tokens": fin.completion_tokens,
                            "seed": parsed.params.seed,
                            "prefill": [],
                            "tokens": [_token_json(t) for t in tokens],
                        }
                    return _json(payload)
            raise AssertionError("engine events ended without a last token")  # pragma: no cover
        except ClientGone:
            return web.Response(status=499)
        finally:
            self._in_flight -= 1
            handle.abort("client disconnected")

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        """`POST /generate_stream`: one event per token; failures arrive inside the stream."""
        body, early = await self._read(request)
        if early is not None:
            return early
        response = await open_event_stream(request, "text/event-stream")

        async def send(payload: object) -> None:
            await response.write(f"data:{dumps(payload)}\n\n".encode())

        try:
            parsed = self._admit(request, body)
        except TgiError as exc:
            await send(exc.body())
            return response
        self._in_flight += 1
        handle = self._start(request, parsed)
        try:
            async for event in token_events(request, handle, self._faults):
                if event is StreamFault.CUT:
                    return response
                if event is StreamFault.ERROR:
                    self._metrics.request_failed("generation")
                    await send({"error": _INJECTED_ERROR, "error_type": "generation"})
                    return response
                fin = event.finished
                chunk: dict[str, Any] = {
                    "index": event.index,
                    "token": _token_json(event.token),
                    "generated_text": None,
                    "details": None,
                }
                if fin is not None:
                    chunk["generated_text"] = parsed.prefix + handle.request.text
                    if parsed.details:
                        chunk["details"] = {
                            "finish_reason": _FINISH_REASON[fin.reason],
                            "generated_tokens": fin.completion_tokens,
                            "seed": parsed.params.seed,
                            "input_length": fin.prompt_tokens,
                        }
                await send(chunk)
        except (ClientGone, ConnectionResetError):
            handle.abort("client disconnected")
        finally:
            self._in_flight -= 1
            handle.abort("client disconnected")
        return response

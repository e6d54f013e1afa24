"""The OpenAI-compatible HTTP door: routes, and one request's life from its body to its last byte.

A request here is admitted by `admission.admit_call`, the function the gRPC servicer calls, and consumed as
the same `RequestRun`: one ticket whichever door it came through, in the same queues, fair order, gates,
caps, TTLs and outcome counters. Its life:

    identify (headers) -> read and parse the body -> admit          any error: its HTTP status, nothing sent
    queued ...                                                       an error here: still its real status
    an engine took it: the response headers go out (streams)         an error after this: an SSE error event
    text ... finished                                                non-streamed: one JSON body at the end

With `x-queue-updates: true` a stream starts at admission instead and carries `: queued ...` comment lines
while it waits; a later failure then arrives in the stream. The server runs with aiohttp's handler
cancellation: a client that disconnects cancels its handler task, which closes the run, which withdraws a
queued request or aborts the engine request, exactly as a cancelled gRPC call does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from typing import Any

import structlog
from aiohttp import web

from scheduler_svc.core.auth import Authenticator
from scheduler_svc.core.errors import PromptTooLarge, SchedulerError
from scheduler_svc.core.request_run import Chunk, Dispatched, Done, Failed, Queued
from scheduler_svc.core.ticket import Ticket
from scheduler_svc.dispatch.intake import admit_call, count_rejection
from scheduler_svc.dispatch.scheduler import Scheduler
from scheduler_svc.http import headers as hdr
from scheduler_svc.http import shapes
from scheduler_svc.http.errors import ErrorReply, error_reply
from scheduler_svc.http.parsing import Call, Kind, decode_json, parse_call

log = structlog.get_logger(__name__)

BODY_MARGIN_BYTES = 256 * 1024
MAX_HEADER_FIELD_BYTES = 8190  # one header line (aiohttp's default, stated here so it is a decision)
MAX_HEADERS = 64


def default_body_limit(max_prompt_bytes: int) -> int:
    """Twice the largest prompt (JSON escaping) plus room for the other fields."""
    return 2 * max_prompt_bytes + BODY_MARGIN_BYTES


def json_response(reply: ErrorReply, request_id: str = "") -> web.Response:
    response = web.json_response(reply.body, status=reply.status, headers=reply.headers)
    if request_id:
        response.headers[hdr.REQUEST_ID_HEADER] = request_id
    return response


class HttpDoor:
    """The aiohttp application of the door over a Scheduler; `runner()` serves it."""

    def __init__(self, scheduler: Scheduler, authenticator: Authenticator) -> None:
        self._scheduler = scheduler
        self._auth = authenticator
        server = scheduler.config.server
        self._user_header = server.http_user_header
        self.body_limit = server.http_max_body_bytes or default_body_limit(
            max(model.max_prompt_bytes for model in scheduler.config.models)
        )

    def application(self) -> web.Application:
        app = web.Application(client_max_size=self.body_limit, middlewares=[_json_errors])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        return app

    def runner(self, *, shutdown_timeout: float) -> web.AppRunner:
        """A runner whose handlers are cancelled when their client disconnects (that cancels the request)."""
        return web.AppRunner(
            self.application(),
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=shutdown_timeout,
            max_field_size=MAX_HEADER_FIELD_BYTES,
            max_headers=MAX_HEADERS,
        )

    def _identify(self, request: web.Request) -> str:
        transport = request.transport
        peer = transport.get_extra_info("peercert") if transport is not None else None
        return hdr.identify(self._auth, request.headers.items(), self._user_header, peer)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def _body(self, request: web.Request) -> bytes:
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise PromptTooLarge(
                f"the request body is over {self.body_limit} bytes (server.http_max_body_bytes)",
                limit=self.body_limit,
            ) from None

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        model = ""
        try:
            user = self._identify(request)  # before the body: a caller without identity learns nothing more
            body = decode_json(await self._body(request))
            model = str(body.get("model") or "")
            call = parse_call(body, kind)
            asked = dataclasses.replace(
                call.request,
                request_id=request.headers.get(hdr.REQUEST_ID_HEADER, ""),
                priority_class=request.headers.get(hdr.PRIORITY_CLASS_HEADER, call.metadata_priority_class),
            )
            timeout = hdr.timeout_seconds(request.headers)
            updates = call.stream and hdr.wants_queue_updates(request.headers)
            ticket = await admit_call(
                self._scheduler, asked, identify=lambda: user, timeout=timeout, watch_positions=updates
            )
        except SchedulerError as exc:
            count_rejection(self._scheduler, model, exc)
            return json_response(error_reply(exc))
        try:
            return await self._respond(request, call, ticket)
        finally:
            ticket.close()

    async def _respond(self, request: web.Request, call: Call, ticket: Ticket) -> web.StreamResponse:
        req = ticket.request
        prefix = "chatcmpl-" if call.kind == "chat" else "cmpl-"
        shape = shapes.Shapes(call.kind, prefix + req.request_id, int(time.time()), req.model)
        updates = call.stream and hdr.wants_queue_updates(request.headers)
        stream: web.StreamResponse | None = None
        parts: list[str] = []
        done: Done | None = None
        announced = False  # whether a stream's first chunk (the assistant's role) went out
        failure: BaseException | None = None
        try:  # the run is consumed to its end: it records the outcome after its last event
            run = self._scheduler.request_run(ticket, watch_positions=updates)
            async with contextlib.aclosing(run.events()) as events:
                async for event in events:
                    if isinstance(event, Queued):
                        if updates:
                            stream = stream or await self._start_stream(request, req.public_id)
                            await stream.write(shapes.comment(self._queued_line(ticket, event.position)))
                    elif isinstance(event, Dispatched) and call.stream:
                        if stream is None:
                            stream = await self._start_stream(request, req.public_id)
                        if not announced and call.kind == "chat":
                            await stream.write(shapes.event(shape.chunk("", role=True)))
                        announced = True  # a failover's next dispatch starts no second message
                    elif isinstance(event, Chunk):
                        if stream is not None:
                            await stream.write(shapes.event(shape.chunk(event.text)))
                        else:
                            parts.append(event.text)
                    elif isinstance(event, Done):
                        done = event
                        if stream is not None:
                            use = shapes.usage(event.prompt_tokens, event.completion_tokens)
                            await stream.write(shapes.event(shape.chunk("", event.finish_reason)))
                            if call.include_usage:
                                await stream.write(shapes.event(shape.usage_chunk(use)))
                            await stream.write(shapes.DONE)
                    elif isinstance(event, Failed):
                        failure = event.error
        except ConnectionResetError:  # the client left while we wrote: the run is closed (cancelled) already
            log.debug("http_client_gone", request_id=req.request_id)
            return stream or web.Response(status=499)
        except Exception as exc:  # a bug of ours: the client hears INTERNAL, as over gRPC
            log.exception("http_request_failed", request_id=req.request_id)
            failure = exc
        if failure is not None or done is None:
            return await self._fail(
                stream, failure or AssertionError("the run ended without an outcome"), req.public_id
            )
        if stream is None:
            use = shapes.usage(done.prompt_tokens, done.completion_tokens)
            body = shape.response("".join(parts), done.finish_reason, use)
            return web.json_response(body, headers={hdr.REQUEST_ID_HEADER: req.public_id})
        await stream.write_eof()
        return stream

    async def _fail(self, stream: web.StreamResponse | None, exc: BaseException, request_id: str) -> web.StreamResponse:
        reply = error_reply(exc)
        if stream is None:  # nothing sent yet: the real status
            return json_response(reply, request_id)
        await stream.write(shapes.event(reply.body))
        await stream.write_eof()
        return stream

    async def _start_stream(self, request: web.Request, request_id: str) -> web.StreamResponse:
        """Send the headers of a stream (once an engine took the request, or at admission for queue updates)."""
        stream = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                hdr.REQUEST_ID_HEADER: request_id,
            }
        )
        await stream.prepare(request)
        return stream

    def _queued_line(self, ticket: Ticket, position: int) -> str:
        outlook = self._scheduler.outlook(ticket)
        wait = outlook.estimated_wait
        eta = "?" if wait is None else f"{wait:.1f}s"
        return f"queued position={position} depth={outlook.depth} eta={eta}"

    async def _models(self, request: web.Request) -> web.Response:
        try:
            self._identify(request)
        except SchedulerError as exc:
            return json_response(error_reply(exc))
        data = [
            {"id": model.name, "object": "model", "created": 0, "owned_by": "llm-scheduler"}
            for model in self._scheduler.config.models
        ]
        return web.json_response({"object": "list", "data": data})

    async def _healthz(self, _: web.Request) -> web.Response:
        """Liveness: the process answers."""
        return web.json_response({"status": "ok"})

    async def _readyz(self, _: web.Request) -> web.Response:
        """Readiness: admitting, and no dispatch loop failing or wedged."""
        health = self._scheduler.health
        if not self._scheduler.accepting:
            return web.json_response({"status": "draining"}, status=503)
        if not health.serving:
            return web.json_response({"status": "unhealthy", "problems": health.problems}, status=503)
        return web.json_response({"status": "ready"})


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's own answers (unknown path, wrong method) in OpenAI's error shape too."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "invalid_request")
        body = {"error": {"message": exc.reason, "type": "invalid_request_error", "param": None, "code": code}}
        return web.Response(
            status=exc.status,
            text=json.dumps(body),
            content_type="application/json",
            headers={"x-should-retry": "false"},
        )

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
queued request or aborts the engine request, exactly as a cancelled gRPC call does. `x-request-timeout-ms`
bounds the whole call, as a gRPC deadline does: past it a body still uploading or a call not yet admitted
ends 504 `deadline_exceeded`, a queued request 504 `queue_timeout`, and a running one is cut (its engine
request aborted) and ends 504 `deadline_exceeded`.

What is read before admission (headers, the body, idle connections) is bounded in `intake`. Every answer
is in OpenAI's error shape from the one error table, aiohttp's own included; a bug is INTERNAL, counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import HttpVersion11, web

from scheduler_svc.config.derived import http_body_limit, http_reading_limits
from scheduler_svc.core.auth import Authenticator
from scheduler_svc.core.errors import DeadlineExceeded, ModelNotFound, SchedulerError
from scheduler_svc.core.request_run import Chunk, Dispatched, Done, Failed, Queued
from scheduler_svc.core.text import client_text
from scheduler_svc.core.ticket import Outcome, Ticket, TicketState
from scheduler_svc.dispatch.intake import admit_call, count_rejection
from scheduler_svc.dispatch.scheduler import Scheduler
from scheduler_svc.http import headers as hdr
from scheduler_svc.http import shapes
from scheduler_svc.http.errors import ErrorReply, error_reply
from scheduler_svc.http.intake import (
    LINGER_SECONDS,
    MAX_HEADER_FIELD_BYTES,
    MAX_HEADERS,
    DoorConnection,
    Intake,
    ReadBudget,
)
from scheduler_svc.http.parsing import Call, Kind, decode_json, parse_call

log = structlog.get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_ROUTES: dict[Kind, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
_OPERATIONS = {kind: f"POST {route}" for kind, route in _ROUTES.items()}  # a traced call's name (OpenTelemetry's)


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
        config = scheduler.config
        server = config.server
        self._user_header = server.http_user_header
        self.body_limit = http_body_limit(config)
        self.intake = Intake(
            body_limit=self.body_limit,
            body_timeout=server.http_body_timeout_seconds,
            budget=ReadBudget(*http_reading_limits(config)),
        )
        self._header_timeout = server.http_header_timeout_seconds
        # aiohttp's settings of every connection (`connection`); the keep-alive timer closes idle ones
        self._connection_settings: dict[str, Any] = {
            "access_log": None,
            "keepalive_timeout": server.http_idle_timeout_seconds,
            "lingering_time": LINGER_SECONDS,
            "max_field_size": MAX_HEADER_FIELD_BYTES,
            "max_headers": MAX_HEADERS,
        }

    def application(self) -> web.Application:
        app = web.Application(client_max_size=self.body_limit, middlewares=[self._middleware])
        routes = app.router
        routes.add_post(_ROUTES["chat"], self._chat, expect_handler=self._expect_body)
        routes.add_post(_ROUTES["completion"], self._completions, expect_handler=self._expect_body)
        routes.add_get("/v1/models", self._models, expect_handler=_expect)
        routes.add_get("/v1/models/{model:.+}", self._model, expect_handler=_expect)  # ids may hold slashes
        routes.add_get("/healthz", self._healthz, expect_handler=_expect)
        routes.add_get("/readyz", self._readyz, expect_handler=_expect)
        return app

    def runner(self, *, shutdown_timeout: float) -> web.AppRunner:
        """A runner whose handlers are cancelled when their client disconnects (that cancels the request).
        Serve it with `connection` as the protocol factory (`SchedulerServer` does), not a TCPSite: that is
        where the door's read bounds live."""
        return web.AppRunner(
            self.application(),
            handler_cancellation=True,
            shutdown_timeout=shutdown_timeout,
            **self._connection_settings,
        )

    def connection(self, runner: web.AppRunner) -> DoorConnection:
        """A protocol for one new connection to the door (`loop.create_server`'s factory, after setup)."""
        assert runner.server is not None, "runner.setup() first"
        return DoorConnection(
            runner.server,
            loop=asyncio.get_running_loop(),
            header_timeout=self._header_timeout,
            rejected=lambda exc: count_rejection(self._scheduler, "", exc),
            internal=lambda exc: self._scheduler.errors.report("http", exc),
            **self._connection_settings,
        )

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Marks the connection busy while a request is handled (`DoorConnection`'s header clock), and answers
        in OpenAI's shape what aiohttp raises (unknown path, wrong method) and any bug (INTERNAL, counted)."""
        connection = request.protocol
        if isinstance(connection, DoorConnection):
            connection.request_started()
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _routing_error(exc)
        except ConnectionError:  # the client left while we wrote: nothing to answer
            raise
        except Exception as exc:
            self._scheduler.errors.report("http", exc)
            return json_response(error_reply(exc))
        finally:
            if isinstance(connection, DoorConnection):
                connection.request_finished()

    async def _expect_body(self, request: web.Request) -> None:
        """A generation call that waits for `100 Continue` before sending its body: one the door refuses before
        reading a body (no identity, a Content-Type that is not JSON, a Content-Length over the limit) is not
        told to go on, and the handler answers it at once (closing the connection), so its client never sends
        the body."""
        try:
            self._identify(request)
            hdr.check_json_body(request.headers)
            self.intake.check_length(request)
        except SchedulerError:
            return
        await _expect(request)

    def _identify(self, request: web.Request) -> str:
        transport = request.transport
        peer = transport.get_extra_info("peercert") if transport is not None else None
        return hdr.identify(self._auth, request.headers.items(), self._user_header, peer)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        started = loop.time()  # a call's deadline counts from its headers, as the client's own clock does
        model = ""
        body_read = False
        try:
            user = self._identify(request)  # before the body: a caller without identity learns nothing more
            hdr.check_json_body(request.headers)
            call_timeout = hdr.call_timeout_seconds(request.headers)  # it bounds the body's upload too
            async with self.intake.body(request, user, call_timeout=call_timeout) as raw:  # held until parsed
                body_read = True
                body = decode_json(raw)
                model = body["model"] if isinstance(body.get("model"), str) else ""
                call = parse_call(body, kind)
            headers = request.headers
            priority_class = hdr.single(headers, hdr.PRIORITY_CLASS_HEADER)
            asked = dataclasses.replace(
                call.request,
                request_id=hdr.single(headers, hdr.REQUEST_ID_HEADER) or "",
                priority_class=call.metadata_priority_class if priority_class is None else priority_class,
                trace_context=hdr.trace_context(headers),
                end_user=hdr.end_user(headers, call.request.end_user),
            )
            timeout = hdr.timeout_seconds(headers)
            if timeout is not None:
                timeout -= loop.time() - started
            updates = call.stream and hdr.wants_queue_updates(headers)
            ticket = await admit_call(
                self._scheduler,
                asked,
                identify=lambda: user,
                timeout=timeout,
                watch_positions=updates,
                operation=_OPERATIONS[kind],
            )
        except SchedulerError as exc:
            count_rejection(self._scheduler, model, exc)
            response = json_response(error_reply(exc))
            if not body_read:  # what is left of the body is not read: the connection ends with this answer
                response.force_close()
            return response
        deadline = None
        if call_timeout is not None:  # past it, a running request is cut (a queued one expires by itself)
            deadline = loop.call_at(started + call_timeout, _cut_at_deadline, ticket, call_timeout)
        try:
            return await self._respond(request, call, ticket)
        finally:
            if deadline is not None:
                deadline.cancel()
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
        """`queued position=3 depth=40 eta=2.1s`; no `eta` while the scheduler cannot estimate the wait."""
        outlook = self._scheduler.outlook(ticket)
        eta = "" if outlook.estimated_wait is None else f" eta={outlook.estimated_wait:.1f}s"
        return f"queued position={position} depth={outlook.depth}{eta}"

    async def _models(self, request: web.Request) -> web.Response:
        try:
            self._identify(request)
        except SchedulerError as exc:
            return json_response(error_reply(exc))
        data = [_model_object(model.name) for model in self._scheduler.config.models]
        return web.json_response({"object": "list", "data": data})

    async def _model(self, request: web.Request) -> web.Response:
        """`GET /v1/models/{id}`: the model, or 404 `model_not_found` (the SDKs' `models.retrieve`)."""
        name = request.match_info["model"]
        try:
            self._identify(request)
            if self._scheduler.config.model(name) is None:
                served = [m.name for m in self._scheduler.config.models]
                raise ModelNotFound(f"unknown model {client_text(name)}; served models: {served}")
        except SchedulerError as exc:
            return json_response(error_reply(exc))
        return web.json_response(_model_object(name))

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


async def _expect(request: web.Request) -> None:
    """`Expect: 100-continue` answered as aiohttp does; any other expectation is ignored (RFC 9110 allows
    it) rather than refused with aiohttp's 417, an answer off the error table, before the door's own code."""
    expect = request.headers.get("Expect", "")
    if request.version == HttpVersion11 and expect.lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer itself has not started


def _model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "llm-scheduler"}


def _cut_at_deadline(ticket: Ticket, seconds: float) -> None:
    """The call's deadline passed: a running request is cut (its engine request aborted) and ends EXPIRED;
    a queued one is left to expire in its queue (504 queue_timeout)."""
    if ticket.state is TicketState.DISPATCHED:
        reason = DeadlineExceeded(f"the call's deadline ({seconds:g} s, x-request-timeout-ms) passed while it ran")
        ticket.cut(reason, Outcome.EXPIRED)


def _routing_error(exc: web.HTTPException) -> web.Response:
    """aiohttp's own answers (unknown path, wrong method) in OpenAI's error shape."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "invalid_request")
    body = {"error": {"message": exc.reason, "type": "invalid_request_error", "param": None, "code": code}}
    return web.Response(
        status=exc.status,
        text=json.dumps(body),
        content_type="application/json",
        headers={"x-should-retry": "false"},
    )

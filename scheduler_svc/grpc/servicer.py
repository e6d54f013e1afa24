"""The gRPC face of the scheduler: Submit and Stream, GetQueueState, and the admin calls.

Each RPC runs in its own task: admit, then consume the request's run (`request_run.RequestRun`: queue
positions, dispatch, text, the end) in this same task, so a cancelled call (client gone, deadline) cancels
the engine request by ordinary asyncio cancellation. The ticket's `close()` in `finally` records the single
outcome whatever happened (also when the run was never started).

The admin calls (ReloadConfig, DrainBackend, UndrainBackend) are for the users in `auth.admin_users` only,
and for nobody while that list is empty: they change what every user gets. The reload itself is the
service's (`Reload`, handed in by the server that knows the file); draining is the scheduler's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc
import structlog
from google.protobuf import timestamp_pb2

from backends.errors import BackendError
from llmsched.v1 import scheduler_pb2 as pb
from llmsched.v1 import scheduler_pb2_grpc as pb_grpc
from scheduler_svc.core.auth import Authenticator
from scheduler_svc.core.errors import ConfigInvalid, ModelNotFound, PermissionDenied, SchedulerError
from scheduler_svc.core.request_run import Chunk, Dispatched, Done, Failed, Queued, RequestRun
from scheduler_svc.core.text import client_text
from scheduler_svc.core.ticket import Ticket
from scheduler_svc.dispatch.intake import admit_call, count_rejection
from scheduler_svc.dispatch.scheduler import Scheduler
from scheduler_svc.grpc.introspection import backend_state, queue_state, to_duration, user_limits
from scheduler_svc.grpc.requests import client_request
from scheduler_svc.grpc.status import to_grpc_status

log = structlog.get_logger(__name__)

_FINISH = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH}
_SERVICE = pb.DESCRIPTOR.services_by_name["SchedulerService"].full_name
_SUBMIT, _STREAM = f"{_SERVICE}/Submit", f"{_SERVICE}/Stream"  # a traced call's name (OpenTelemetry's rpc form)

Reload = Callable[[bool, str], list[str]]
"""(dry run, who asks) -> what changed (or would); raises ConfigInvalid or ConfigNeedsRestart, the running
configuration staying."""


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> NoReturn:
    status = to_grpc_status(exc)
    await context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("unreachable: abort raises")


class SchedulerServicer(pb_grpc.SchedulerServiceServicer):
    """Implements llmsched.v1.SchedulerService on top of a Scheduler."""

    def __init__(self, scheduler: Scheduler, authenticator: Authenticator, reload: Reload | None = None) -> None:
        self._scheduler = scheduler
        self._auth = authenticator
        self._reload = reload  # None: the service was not started from a file

    async def _admit(
        self, params: pb.GenerationParams, context: grpc.aio.ServicerContext[Any, Any], *, watch_positions: bool
    ) -> Ticket:
        """Identify the caller, validate and queue the request (a bug on the way: INTERNAL with its
        ErrorInfo, not a bare UNKNOWN)."""
        metadata = context.invocation_metadata()
        return await admit_call(
            self._scheduler,
            client_request(params, metadata),
            identify=lambda: self._auth.identify(metadata, context.auth_context),
            timeout=context.time_remaining(),
            watch_positions=watch_positions,
            operation=_STREAM if watch_positions else _SUBMIT,
        )

    async def _reject(
        self, params: pb.GenerationParams, context: grpc.aio.ServicerContext[Any, Any], exc: SchedulerError
    ) -> NoReturn:
        count_rejection(self._scheduler, params.model, exc)
        await _abort(context, exc)

    def _timings(self, ticket: Ticket) -> pb.Timings:
        start = ticket.request.admitted_at
        end = ticket.finished_at if ticket.finished_at is not None else self._scheduler.clock.now()
        return pb.Timings(
            queue_wait=to_duration(None if ticket.dispatched_at is None else ticket.dispatched_at - start),
            time_to_first_token=to_duration(None if ticket.first_token_at is None else ticket.first_token_at - start),
            total=to_duration(end - start),
            engine_accept=to_duration(ticket.engine_accept),
        )

    def _run(self, ticket: Ticket, *, watch_positions: bool) -> RequestRun:
        return self._scheduler.request_run(ticket, watch_positions=watch_positions)

    async def Submit(
        self,
        request: pb.SubmitRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.SubmitResponse:
        try:
            ticket = await self._admit(request.params, context, watch_positions=False)
        except SchedulerError as exc:
            await self._reject(request.params, context, exc)
        try:
            parts: list[str] = []
            done: Done | None = None
            async with contextlib.aclosing(self._run(ticket, watch_positions=False).events()) as events:
                async for event in events:
                    if isinstance(event, Chunk):
                        parts.append(event.text)
                    elif isinstance(event, Done):
                        done = event
                    elif isinstance(event, Failed):
                        raise event.error  # reported below, as an exception from the run would be
            assert done is not None and ticket.backend is not None
            return pb.SubmitResponse(
                request_id=ticket.request.public_id,
                text="".join(parts),
                finish_reason=_FINISH.get(done.finish_reason, pb.FINISH_REASON_UNSPECIFIED),
                usage=pb.Usage(prompt_tokens=done.prompt_tokens, completion_tokens=done.completion_tokens),
                timings=self._timings(ticket),
                backend=ticket.backend.name,
            )
        except (SchedulerError, BackendError) as exc:
            await _abort(context, exc)
        except Exception as exc:
            log.exception("submit_failed", request_id=ticket.request.request_id)
            await _abort(context, exc)
        finally:
            ticket.close()

    async def Stream(
        self,
        request: pb.StreamRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.StreamResponse]:
        try:
            ticket = await self._admit(request.params, context, watch_positions=True)
        except SchedulerError as exc:
            await self._reject(request.params, context, exc)
        req = ticket.request
        try:
            # gRPC closes this handler at a `yield` when the client goes away; closing the run here at once
            # (not when it is garbage-collected) is what aborts the engine request.
            async with contextlib.aclosing(self._run(ticket, watch_positions=True).events()) as events:
                async for event in events:
                    if isinstance(event, Queued):
                        yield pb.StreamResponse(queued=self._queued(ticket, event.position))
                    elif isinstance(event, Dispatched):
                        yield pb.StreamResponse(dispatched=self._dispatched(ticket))
                    elif isinstance(event, Chunk):
                        yield pb.StreamResponse(delta=pb.Delta(text=event.text, tokens=event.tokens))
                    elif isinstance(event, Done):
                        yield pb.StreamResponse(finished=self._finished(ticket, event))
                    elif isinstance(event, Failed):
                        raise event.error  # reported below, as an exception from the run would be
        except (SchedulerError, BackendError) as exc:
            await _abort(context, exc)
        except Exception as exc:
            log.exception("stream_failed", request_id=req.request_id)
            await _abort(context, exc)
        finally:
            ticket.close()

    def _dispatched(self, ticket: Ticket) -> pb.Dispatched:
        assert ticket.backend is not None and ticket.dispatched_at is not None
        sent_at = timestamp_pb2.Timestamp()
        sent_at.FromNanoseconds(int((ticket.dispatched_wall or time.time()) * 1e9))
        return pb.Dispatched(
            backend=ticket.backend.name,
            dispatched_at=sent_at,
            queue_wait=to_duration(ticket.dispatched_at - ticket.request.admitted_at),
        )

    def _finished(self, ticket: Ticket, event: Done) -> pb.Finished:
        return pb.Finished(
            finish_reason=_FINISH.get(event.finish_reason, pb.FINISH_REASON_UNSPECIFIED),
            usage=pb.Usage(prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens),
            timings=self._timings(ticket),
        )

    def _queued(self, ticket: Ticket, position: int) -> pb.Queued:
        outlook = self._scheduler.outlook(ticket)
        return pb.Queued(
            request_id=ticket.request.public_id,
            position_in_user_queue=position,
            model_queue_depth=outlook.depth,
            priority_class=ticket.request.priority_class,
            estimated_wait=to_duration(outlook.estimated_wait),
        )

    async def GetQueueState(
        self, request: pb.GetQueueStateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetQueueStateResponse:
        try:
            user = self._auth.identify(context.invocation_metadata(), context.auth_context)
            admins = self._scheduler.config.auth.admin_users
            if admins and user not in admins:
                raise PermissionDenied(f"user {client_text(user)} may not read the queue state (auth.admin_users)")
            if request.model and request.model not in self._scheduler.models():
                raise ModelNotFound(f"unknown model {client_text(request.model)}")
            max_users = user_limits(request.user, request.max_users if request.HasField("max_users") else None)
        except SchedulerError as exc:
            await _abort(context, exc)
        names = [request.model] if request.model else self._scheduler.models()
        return pb.GetQueueStateResponse(
            models=[queue_state(self._scheduler.snapshot(name, request.user, max_users)) for name in names]
        )

    # -- admin -------------------------------------------------------------------------------------------------
    def _admin(self, context: grpc.aio.ServicerContext[Any, Any], action: str) -> str:
        """The calling admin's user id; PermissionDenied for anyone else, and for everyone while
        `auth.admin_users` is empty."""
        user = self._auth.identify(context.invocation_metadata(), context.auth_context)
        admins = self._scheduler.config.auth.admin_users
        if not admins:
            raise PermissionDenied(f"{action} needs an admin, and auth.admin_users names none")
        if user not in admins:
            raise PermissionDenied(f"user {client_text(user)} may not {action} (auth.admin_users)")
        return user

    async def ReloadConfig(
        self, request: pb.ReloadConfigRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ReloadConfigResponse:
        try:
            user = self._admin(context, "reload the configuration")
            if self._reload is None:
                raise ConfigInvalid("this service was not started from a configuration file: there is none to read")
            changes = self._reload(request.dry_run, f"admin {user}")
        except SchedulerError as exc:
            await _abort(context, exc)
        return pb.ReloadConfigResponse(changes=changes, applied=not request.dry_run)

    async def DrainBackend(
        self, request: pb.DrainBackendRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DrainBackendResponse:
        return pb.DrainBackendResponse(backends=await self._drain(request, context, drain=True))

    async def UndrainBackend(
        self, request: pb.UndrainBackendRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.UndrainBackendResponse:
        return pb.UndrainBackendResponse(backends=await self._drain(request, context, drain=False))

    async def _drain(
        self,
        request: pb.DrainBackendRequest | pb.UndrainBackendRequest,
        context: grpc.aio.ServicerContext[Any, Any],
        *,
        drain: bool,
    ) -> list[pb.BackendQueueState]:
        """Drain (or undrain) `request.backend` for an admin; the states of the backends it touched."""
        try:
            user = self._admin(context, "drain a backend" if drain else "undrain a backend")
            touched = self._scheduler.drain_backend(request.model, request.backend, drain=drain)
        except SchedulerError as exc:
            await _abort(context, exc)
        event = "admin_drained_backend" if drain else "admin_undrained_backend"
        log.info(event, user=user, backend=request.backend, models=[m for m, _ in touched])
        return [backend_state(model, status) for model, status in touched]

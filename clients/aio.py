"""`AsyncClient`: the asyncio client (typed events and errors, retries, deadlines). `Client` in
`clients.sync` is this client, blocking."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, TypeVar

import grpc

from clients._arguments import GenerationCall, generation_call, takes
from clients._connection import Connection
from clients.errors import from_rpc_error
from clients.events import Completion, Delta, Event, completion_from_pb, event_from_pb
from clients.retry import CallDefaults, Retrier, RetryAttempt, RetryPolicy
from llmsched.v1 import scheduler_pb2 as pb

RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")


class AsyncClient(Connection):
    """Talks to one llm-scheduler from asyncio code.

    Identity: `api_key` (sent as a bearer key) or `user` (sent as `x-user-id`). `timeout`: the default
    overall deadline of a call in seconds (None: none), which a call's own `timeout` or `deadline` replaces;
    it becomes the gRPC deadline, and retries share it. `retry`: the policy (`NO_RETRY` to turn retries
    off); `on_retry` hears of each retry before its wait. TLS as for `SchedulerClient`.
    """

    def __init__(
        self,
        target: str,
        *,
        user: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        on_retry: Callable[[RetryAttempt], None] | None = None,
        tls: bool = False,
        root_certificates: bytes | None = None,
        certificate_chain: bytes | None = None,
        private_key: bytes | None = None,
    ) -> None:
        super().__init__(
            target,
            user=user,
            api_key=api_key,
            tls=tls,
            root_certificates=root_certificates,
            certificate_chain=certificate_chain,
            private_key=private_key,
        )
        self._calls = CallDefaults(timeout, retry or RetryPolicy(), on_retry)

    @takes(generation_call)
    async def submit(self, call: GenerationCall) -> Completion:
        """Run one generation and return it whole. Raises SchedulerError."""
        request = pb.SubmitRequest(params=call.params)
        retrier = self._calls.retrier(call.timeout, call.deadline)
        while True:
            try:
                response: pb.SubmitResponse = await self._stub.Submit(
                    request, metadata=call.metadata(self._metadata), timeout=retrier.deadline.remaining()
                )
                return completion_from_pb(response)
            except grpc.aio.AioRpcError as exc:
                error = from_rpc_error(exc)
                delay = retrier.next_delay(error, produced_tokens=False, unary=True)
                if delay is None:
                    raise error from exc
            await asyncio.sleep(delay)

    @takes(generation_call)
    def stream(self, call: GenerationCall) -> AsyncEventStream:
        """Start a streamed generation: iterate the result for typed events (see `clients.events` for their
        order), `cancel()` it (or leave the loop) to abort. Raises SchedulerError while iterating."""
        request = pb.StreamRequest(params=call.params)
        retrier = self._calls.retrier(call.timeout, call.deadline)

        def start(remaining: float | None) -> grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]:
            return self._stub.Stream(request, metadata=call.metadata(self._metadata), timeout=remaining)

        return AsyncEventStream(start, retrier)

    async def stream_text(self, model: str, prompt: str = "", **kwargs: Any) -> AsyncIterator[str]:
        """Just the generated text chunks of a streamed generation."""
        async with self.stream(model, prompt, **kwargs) as events:
            async for event in events:
                if isinstance(event, Delta):
                    yield event.text

    async def queue_state(
        self, model: str = "", user: str = "", max_users: int | None = None, *, timeout: float | None = None
    ) -> pb.GetQueueStateResponse:
        """Queue depths, gate states and fair-share counters (admins only when admin_users is set)."""
        return await self._unary(
            self._stub.GetQueueState, pb.GetQueueStateRequest(model=model, user=user, max_users=max_users), timeout
        )

    async def reload_config(self, dry_run: bool = False, *, timeout: float | None = None) -> pb.ReloadConfigResponse:
        """Admins only: the service reads its configuration file again and applies what changed, as on SIGHUP
        (`dry_run`: it only says what would change). A file it refuses raises FailedPreconditionError
        (CONFIG_INVALID, CONFIG_NEEDS_RESTART); the running configuration then stays."""
        return await self._unary(self._stub.ReloadConfig, pb.ReloadConfigRequest(dry_run=dry_run), timeout)

    async def drain_backend(
        self, backend: str, model: str = "", *, timeout: float | None = None
    ) -> pb.DrainBackendResponse:
        """Admins only: no new request goes to `backend` (of `model`; empty: of every model that has one), the
        ones it runs finish, the queue goes to the other backends, until `undrain_backend`."""
        return await self._unary(self._stub.DrainBackend, pb.DrainBackendRequest(model=model, backend=backend), timeout)

    async def undrain_backend(
        self, backend: str, model: str = "", *, timeout: float | None = None
    ) -> pb.UndrainBackendResponse:
        """Admins only: `backend` takes requests again (unless its configuration drains it)."""
        return await self._unary(
            self._stub.UndrainBackend, pb.UndrainBackendRequest(model=model, backend=backend), timeout
        )

    async def _unary(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable[RequestT, ResponseT],
        request: RequestT,
        timeout: float | None,
    ) -> ResponseT:
        """One call without retries, under `timeout` (None: the client's default); raises SchedulerError."""
        try:
            return await method(
                request, metadata=self._metadata, timeout=timeout if timeout is not None else self._calls.timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from exc


class AsyncEventStream:
    """The events of one streamed generation, across retries; iterate once.

    Leaving the loop early, `cancel()` or `aclose()` cancels the call: a queued request leaves the queue and
    a running one is aborted in the engine. After `cancel()` the iteration simply ends.
    """

    def __init__(
        self,
        start: Callable[[float | None], grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]],
        retrier: Retrier,
    ) -> None:
        self._start = start
        self._retrier = retrier
        self._call: grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse] | None = None
        self._cancelled = asyncio.Event()  # also what a retry's wait waits on, so cancel() cuts it short
        self._events = self._run()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events

    async def __aenter__(self) -> AsyncEventStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def cancel(self) -> None:
        """Abort the request (queued: it leaves the queue; running: the engine stops generating)."""
        self._cancelled.set()
        if self._call is not None:
            self._call.cancel()

    async def aclose(self) -> None:
        self.cancel()
        await self._events.aclose()

    @property
    def attempts(self) -> int:
        """Calls made so far (more than one after retries)."""
        return self._retrier.attempt

    async def _run(self) -> AsyncGenerator[Event, None]:
        while not self._cancelled.is_set():
            call = self._call = self._start(self._retrier.deadline.remaining())
            produced = False
            try:
                async for message in call:
                    event = event_from_pb(message)
                    produced = produced or isinstance(event, Delta)
                    yield event
                return
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._cancelled.is_set() and task is not None and not task.cancelling():
                    return  # our own cancel(): the stream just ends
                raise
            except grpc.aio.AioRpcError as exc:
                if self._cancelled.is_set():
                    return
                error = from_rpc_error(exc)
                delay = self._retrier.next_delay(error, produced_tokens=produced)
                if delay is None:
                    raise error from exc
            finally:
                call.cancel()  # nothing once the call has ended; aborts it when the consumer left early
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._cancelled.wait(), delay)

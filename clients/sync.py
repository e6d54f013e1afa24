"""`Client`: the blocking client, with the surface of `clients.aio.AsyncClient` (typed events and errors,
retries, deadlines) over gRPC's synchronous channel. Safe to share between threads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from types import TracebackType
from typing import Any

import grpc

from clients._connection import channel_credentials, generation_params, identity_metadata
from clients.errors import from_rpc_error
from clients.events import Completion, Delta, Event, completion_from_pb, event_from_pb
from clients.retry import CallDefaults, Retrier, RetryAttempt, RetryPolicy
from llmsched.v1 import scheduler_pb2 as pb
from llmsched.v1 import scheduler_pb2_grpc as pb_grpc

_StreamCall = Any  # grpc's sync streaming call: an iterator of messages that is also a grpc.Call


class Client:
    """Talks to one llm-scheduler, blocking. Arguments as for `AsyncClient`."""

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
        credentials = channel_credentials(tls, root_certificates, certificate_chain, private_key)
        self._channel = grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
        self._stub = pb_grpc.SchedulerServiceStub(self._channel)
        self._metadata = identity_metadata(user, api_key)
        self._calls = CallDefaults(timeout, retry or RetryPolicy(), on_retry)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def submit(
        self,
        model: str,
        prompt: str = "",
        *,
        messages: Sequence[tuple[str, str]] = (),
        timeout: float | None = None,
        deadline: float | None = None,
        **fields: Any,
    ) -> Completion:
        """Run one generation and return it whole (see `AsyncClient.submit`)."""
        request = pb.SubmitRequest(params=generation_params(model, prompt, messages, fields))
        retrier = self._calls.retrier(timeout, deadline)
        while True:
            try:
                response: pb.SubmitResponse = self._stub.Submit(
                    request, metadata=self._metadata, timeout=retrier.deadline.remaining()
                )
                return completion_from_pb(response)
            except grpc.RpcError as exc:
                error = from_rpc_error(exc)
                delay = retrier.next_delay(error, produced_tokens=False, unary=True)
                if delay is None:
                    raise error from exc
            threading.Event().wait(delay)

    def stream(
        self,
        model: str,
        prompt: str = "",
        *,
        messages: Sequence[tuple[str, str]] = (),
        timeout: float | None = None,
        deadline: float | None = None,
        **fields: Any,
    ) -> EventStream:
        """Start a streamed generation: iterate the result for typed events, `cancel()` it (from any thread)
        or `close()` it to abort (see `AsyncClient.stream`)."""
        request = pb.StreamRequest(params=generation_params(model, prompt, messages, fields))
        retrier = self._calls.retrier(timeout, deadline)

        def start(remaining: float | None) -> _StreamCall:
            return self._stub.Stream(request, metadata=self._metadata, timeout=remaining)

        return EventStream(start, retrier)

    def stream_text(self, model: str, prompt: str = "", **kwargs: Any) -> Iterator[str]:
        """Just the generated text chunks of a streamed generation."""
        with self.stream(model, prompt, **kwargs) as events:
            for event in events:
                if isinstance(event, Delta):
                    yield event.text

    def queue_state(
        self, model: str = "", user: str = "", max_users: int | None = None, *, timeout: float | None = None
    ) -> pb.GetQueueStateResponse:
        """Queue depths, gate states and fair-share counters (admins only when admin_users is set)."""
        try:
            response: pb.GetQueueStateResponse = self._stub.GetQueueState(
                pb.GetQueueStateRequest(model=model, user=user, max_users=max_users),
                metadata=self._metadata,
                timeout=timeout if timeout is not None else self._calls.timeout,
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc
        return response


class EventStream:
    """The events of one streamed generation, across retries; iterate once (see `AsyncEventStream`)."""

    def __init__(self, start: Callable[[float | None], _StreamCall], retrier: Retrier) -> None:
        self._start = start
        self._retrier = retrier
        self._call: _StreamCall | None = None
        self._lock = threading.Lock()
        self._cancelled = threading.Event()  # also what a retry's wait sleeps on, so cancel() cuts it short
        self._events = self._run()

    def __iter__(self) -> Iterator[Event]:
        return self._events

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def cancel(self) -> None:
        """Abort the request (queued: it leaves the queue; running: the engine stops generating)."""
        with self._lock:
            self._cancelled.set()
            if self._call is not None:
                self._call.cancel()

    def close(self) -> None:
        self.cancel()
        self._events.close()

    @property
    def attempts(self) -> int:
        """Calls made so far (more than one after retries)."""
        return self._retrier.attempt

    def _run(self) -> Generator[Event, None, None]:
        while True:
            with self._lock:
                if self._cancelled.is_set():
                    return
                call = self._call = self._start(self._retrier.deadline.remaining())
            produced = False
            try:
                for message in call:
                    event = event_from_pb(message)
                    produced = produced or isinstance(event, Delta)
                    yield event
                return
            except grpc.RpcError as exc:
                if self._cancelled.is_set():
                    return
                error = from_rpc_error(exc)
                delay = self._retrier.next_delay(error, produced_tokens=produced)
                if delay is None:
                    raise error from exc
            finally:
                call.cancel()
            self._cancelled.wait(delay)

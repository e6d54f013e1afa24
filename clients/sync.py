"""`Client`: the blocking client. It is an `AsyncClient` whose calls run on a background event loop
(`clients._loop`) while the calling thread waits: one implementation of retries, deadlines, events and
cancellation, with the same arguments and methods (the signatures are `AsyncClient`'s own)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Generator, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

from clients._arguments import like, takes
from clients._loop import LoopThread, shared_loop
from clients.aio import AsyncClient, AsyncEventStream
from clients.events import Delta, Event
from llmsched.v1 import scheduler_pb2 as pb

P = ParamSpec("P")
T = TypeVar("T")


def _made_on_the_loop(factory: Callable[P, T]) -> Callable[P, T]:
    """`factory` (with its parameters), called on the loop: a gRPC asyncio channel belongs to the loop it was
    made on."""

    def make(*args: P.args, **kwargs: P.kwargs) -> T:
        return shared_loop().run(_made(factory, *args, **kwargs))

    make.__signature__ = inspect.signature(factory)  # type: ignore[attr-defined]
    return make


async def _made(factory: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return factory(*args, **kwargs)


def _blocking(method: Callable[Concatenate[AsyncClient, P], Awaitable[T]]) -> Callable[Concatenate[Client, P], T]:
    """A `Client` method that runs `method` of its AsyncClient on the loop and returns the result."""

    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._loop.run(method(self._async, *args, **kwargs))

    return like(call, method, parameters_of=method, returns=inspect.signature(method).return_annotation, owner="Client")


def _blocking_stream(
    method: Callable[Concatenate[AsyncClient, P], AsyncEventStream],
) -> Callable[Concatenate[Client, P], EventStream]:
    """A `Client` method that starts `method`'s stream of its AsyncClient, to be iterated from this thread."""

    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> EventStream:
        return EventStream(method(self._async, *args, **kwargs), self._loop)

    return like(call, method, parameters_of=method, returns="EventStream", owner="Client")


class Client:
    """Talks to one llm-scheduler, blocking; arguments as for `AsyncClient`. Safe to share between threads.
    `on_retry` is called on the background loop's thread."""

    @takes(_made_on_the_loop(AsyncClient))
    def __init__(self, client: AsyncClient) -> None:
        self._async = client
        self._loop = shared_loop()

    submit = _blocking(AsyncClient.submit)
    stream = _blocking_stream(AsyncClient.stream)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._loop.run(self._async.close())

    def stream_text(self, model: str, prompt: str = "", **kwargs: Any) -> Iterator[str]:
        """Just the generated text chunks of a streamed generation."""
        with self.stream(model, prompt, **kwargs) as events:
            yield from (event.text for event in events if isinstance(event, Delta))

    def queue_state(
        self, model: str = "", user: str = "", max_users: int | None = None, *, timeout: float | None = None
    ) -> pb.GetQueueStateResponse:
        """Queue depths, gate states and fair-share counters (see `AsyncClient.queue_state`)."""
        return self._loop.run(self._async.queue_state(model, user, max_users, timeout=timeout))

    def reload_config(self, dry_run: bool = False, *, timeout: float | None = None) -> pb.ReloadConfigResponse:
        """Admins: reload the service's configuration file (see `AsyncClient.reload_config`)."""
        return self._loop.run(self._async.reload_config(dry_run, timeout=timeout))

    def drain_backend(self, backend: str, model: str = "", *, timeout: float | None = None) -> pb.DrainBackendResponse:
        """Admins: drain a backend (see `AsyncClient.drain_backend`)."""
        return self._loop.run(self._async.drain_backend(backend, model, timeout=timeout))

    def undrain_backend(
        self, backend: str, model: str = "", *, timeout: float | None = None
    ) -> pb.UndrainBackendResponse:
        """Admins: undrain a backend (see `AsyncClient.undrain_backend`)."""
        return self._loop.run(self._async.undrain_backend(backend, model, timeout=timeout))


class EventStream:
    """The events of one streamed generation, across retries; iterate once (see `AsyncEventStream`).
    `cancel()` works from any thread; `close()` (or leaving the `with` block) cancels too."""

    def __init__(self, events: AsyncEventStream, loop: LoopThread) -> None:
        self._events = events
        self._loop = loop
        self._iterator = self._each()

    def __iter__(self) -> Iterator[Event]:
        return self._iterator

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def cancel(self) -> None:
        """Abort the request (queued: it leaves the queue; running: the engine stops generating)."""
        self._loop.call_soon(self._events.cancel)

    def close(self) -> None:
        self._loop.run(self._events.aclose())

    @property
    def attempts(self) -> int:
        """Calls made so far (more than one after retries)."""
        return self._events.attempts

    def _each(self) -> Generator[Event, None, None]:
        """Each event, awaited on the loop while this thread waits."""
        events = aiter(self._events)
        while (event := self._loop.run(anext(events, None))) is not None:
            yield event

"""The event loop the blocking `Client` runs `AsyncClient` on: one daemon thread per process, started by the
first `Client`, shared by all of them (a client's channel lives on the loop, so any thread may call it)."""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class LoopThread:
    """An asyncio loop on a daemon thread, for blocking code to run coroutines on and wait for them."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="llmsched-client-loop", daemon=True)
        self._thread.start()

    def run(self, awaitable: Awaitable[T]) -> T:
        """Await `awaitable` on the loop and return its result here. A caller that stops waiting (Ctrl-C)
        cancels it, which cancels its gRPC call."""
        if threading.current_thread() is self._thread:  # it would wait for itself forever
            if inspect.iscoroutine(awaitable):
                awaitable.close()
            raise RuntimeError("a blocking client call from its own event loop (in an on_retry callback?)")
        future = asyncio.run_coroutine_threadsafe(_awaited(awaitable), self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run `callback` on the loop, after what was handed to it before (from any thread)."""
        self._loop.call_soon_threadsafe(callback)


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


_shared: LoopThread | None = None
_shared_lock = threading.Lock()


def shared_loop() -> LoopThread:
    """The process's loop thread, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = LoopThread()
        return _shared


def _forget_shared_loop() -> None:
    """A forked child has no loop thread (threads do not survive fork): its first Client starts its own."""
    global _shared, _shared_lock
    _shared, _shared_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_shared_loop)

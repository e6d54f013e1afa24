"""Which asyncio event loop the service runs on (`server.event_loop`).

Why uvloop by default: every streamed token crosses the loop twice (the engine's SSE read, the gRPC or
HTTP write), so the loop's own cost is paid per token. On the simulator, 32 streams x 256 tokens, the
scheduler took about 350 us of CPU per token on asyncio's loop and about 285 us on uvloop; on a CPU host
that CPU is taken from the engine, on a GPU host from the engine's own HTTP front end. vLLM's API server
runs on uvloop for the same reason. `asyncio` stays available (debugging, platforms without uvloop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

EVENT_LOOPS = ("uvloop", "asyncio")


def run_on(kind: str, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run `main()` to completion on a new event loop of `kind` (one of EVENT_LOOPS), as `asyncio.run` does."""
    if kind == "uvloop":
        import uvloop  # imported only when chosen: the asyncio loop needs none of it

        return uvloop.run(main())
    if kind == "asyncio":
        return asyncio.run(main())
    raise ValueError(f"unknown event loop {kind!r}; one of {', '.join(EVENT_LOOPS)}")

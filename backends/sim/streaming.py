"""HTTP plumbing shared by both engine APIs: reading engine events while watching the client.

A client that goes away must abort its request in the engine at once, whether it is streaming or still
queued. aiohttp cancels the handler on disconnect only when the server runs with
`handler_cancellation=True` (our runners do), so a small watchdog per request also polls the
connection: that keeps aborts working under any runner.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from backends.sim.engine import Aborted, EngineEvent, RequestHandle
from backends.sim.faults import Faults

_POLL_SECONDS = 0.2
_CLIENT_GONE = "client disconnected"


class ClientGone(Exception):
    """The HTTP client closed its connection."""


def client_gone(request: web.Request) -> bool:
    """True once the client's connection is closed or closing."""
    transport = request.transport
    return transport is None or transport.is_closing()


async def watch_events(request: web.Request, handle: RequestHandle) -> AsyncIterator[EngineEvent]:
    """The request's engine events; raises `ClientGone` (after aborting it) if the client leaves first."""
    watchdog = asyncio.create_task(_abort_when_client_leaves(request, handle))
    try:
        async for event in handle:
            if isinstance(event, Aborted) and event.reason == _CLIENT_GONE:
                raise ClientGone
            yield event
    finally:
        watchdog.cancel()


async def _abort_when_client_leaves(request: web.Request, handle: RequestHandle) -> None:
    """One poller per request (not per token): cheap even when tokens stream fast."""
    while not handle.done:
        await asyncio.sleep(_POLL_SECONDS)
        if client_gone(request):
            handle.abort(_CLIENT_GONE)
            return


async def healthy(request: web.Request) -> web.Response:
    """`GET /health` as both engines answer it: 200 with an empty body."""
    return web.Response(status=200)


def dumps(payload: Any) -> str:
    """Compact JSON, as pydantic and serde write it."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


async def open_event_stream(request: web.Request, content_type: str) -> web.StreamResponse:
    """Start a 200 Server-Sent Events response."""
    response = web.StreamResponse(status=200, headers={"Content-Type": content_type, "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


def cut_connection(request: web.Request) -> None:
    """Close the connection without finishing the response, the way a crashed engine does."""
    transport = request.transport
    if transport is not None:
        transport.close()


def injected_fault(faults: Faults, tokens_sent: int, handle: RequestHandle, request: web.Request) -> str | None:
    """Apply the fault injected for the token after `tokens_sent`, if any: "cut" aborts the request and cuts the
    connection (the handler just returns), "error" aborts it (the handler answers with its engine's error)."""
    fault = faults.in_stream(tokens_sent)
    if fault == "cut":
        handle.abort("injected stream cut")
        cut_connection(request)
    elif fault == "error":
        handle.abort("injected stream error")
    return fault

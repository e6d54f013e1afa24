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
from enum import Enum
from typing import Any

from aiohttp import web

from backends.sim.engine import Aborted, EngineEvent, RequestHandle, SimEngine, TokenEvent
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


async def injected_refusal(faults: Faults, engine: SimEngine, request_id: str | None) -> tuple[int, str] | None:
    """Apply the injected intake delay, then the injected refusal of every request, if one is set: its status
    and message, already noted and journaled as the engine's refusal (each API words the answer itself)."""
    if faults.intake_delay_ms:
        await asyncio.sleep(faults.intake_delay_ms / 1000)  # the injected delay itself
    status = faults.reject_all_with_status
    if status is None:
        return None
    message = f"Simulated HTTP {status} (fault injection)"
    engine.note_rejected()
    engine.journal_refused(request_id, None, status, message)
    return status, message


class StreamFault(Enum):
    """How a request's token stream broke off, as `token_events` reports it (its last item)."""

    CUT = "cut"  # the engine shut down or a cut was injected: the connection is cut, the handler just returns
    ERROR = "error"  # an error was injected: the request is aborted, the handler answers with its engine's error


async def token_events(
    request: web.Request, handle: RequestHandle, faults: Faults
) -> AsyncIterator[TokenEvent | StreamFault]:
    """The request's tokens while watching the client (as `watch_events`), with the fault injected for a token
    (after as many tokens as came before it) applied in its place; raises `ClientGone` if the client leaves."""
    tokens = 0
    async for event in watch_events(request, handle):
        if isinstance(event, Aborted):  # the engine shut down: die like a crashed server
            cut_connection(request)
            yield StreamFault.CUT
            return
        fault = faults.in_stream(tokens)
        if fault == "cut":
            handle.abort("injected stream cut")
            cut_connection(request)
            yield StreamFault.CUT
            return
        if fault == "error":
            handle.abort("injected stream error")
            yield StreamFault.ERROR
            return
        tokens += 1
        yield event

"""Typed reads of a gRPC Stream call's events.

grpc's stubs type `UnaryStreamCall.read()` as `object` (a message, or grpc.aio.EOF once the stream ends) and do
not declare EOF itself; these helpers give a test the `pb.StreamResponse` it reads, or the end as None.
"""

from __future__ import annotations

import grpc

from clients import pb


async def next_event(call: grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]) -> pb.StreamResponse:
    """The call's next event; the test fails if the stream ended instead."""
    event = await call.read()
    assert isinstance(event, pb.StreamResponse), f"stream ended where an event was due: {event!r}"
    return event


async def event_or_end(call: grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]) -> pb.StreamResponse | None:
    """The call's next event, or None once the stream has ended (read() answers EOF, never another type)."""
    event = await call.read()
    return event if isinstance(event, pb.StreamResponse) else None

"""`SchedulerClient`: the raw asyncio layer (protobuf messages, gRPC errors, no retries) with identity on every
call, and helpers to read error details (which follow the error table of `llmsched.v1.errors`). Applications
want `AsyncClient` or `Client`, which add typed events and errors, retries and deadlines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from clients._arguments import GenerationCall, generation_call, takes
from clients._connection import Connection
from clients.errors import from_rpc_error
from llmsched.v1 import scheduler_pb2 as pb


class SchedulerClient(Connection):
    """Talks to one llm-scheduler, one gRPC call per method. Identity (`user` or `api_key`) and TLS as for
    every client (see `clients._connection.Connection`); `submit` and `stream` take `AsyncClient`'s arguments,
    the deadline becoming the one call's."""

    @takes(generation_call)
    async def submit(self, call: GenerationCall) -> pb.SubmitResponse:
        """Run one generation and return the whole answer (one gRPC call under the deadline, no retry)."""
        request = pb.SubmitRequest(params=call.params)
        response: pb.SubmitResponse = await self._stub.Submit(
            request, metadata=call.metadata(self._metadata), timeout=call.grpc_timeout()
        )
        return response

    @takes(generation_call)
    def stream(self, call: GenerationCall) -> grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]:
        """Start a streamed generation; iterate the returned call for events, `.cancel()` it to abort."""
        request = pb.StreamRequest(params=call.params)
        return self._stub.Stream(request, metadata=call.metadata(self._metadata), timeout=call.grpc_timeout())

    async def queue_state(
        self, model: str = "", user: str = "", max_users: int | None = None
    ) -> pb.GetQueueStateResponse:
        """Queue depths, gate states and fair-share counters (admins only when admin_users is set); only
        `user` when given, at most `max_users` users per class (None: the server's default)."""
        response: pb.GetQueueStateResponse = await self._stub.GetQueueState(
            pb.GetQueueStateRequest(model=model, user=user, max_users=max_users), metadata=self._metadata
        )
        return response

    async def reload_config(self, dry_run: bool = False) -> pb.ReloadConfigResponse:
        """Admins: have the service read its configuration file again and apply it (`dry_run`: only say what
        would change)."""
        response: pb.ReloadConfigResponse = await self._stub.ReloadConfig(
            pb.ReloadConfigRequest(dry_run=dry_run), metadata=self._metadata
        )
        return response

    async def drain_backend(self, backend: str, model: str = "") -> pb.DrainBackendResponse:
        """Admins: no new requests to `backend` (of `model`, or of every model that has one) until undrained."""
        response: pb.DrainBackendResponse = await self._stub.DrainBackend(
            pb.DrainBackendRequest(model=model, backend=backend), metadata=self._metadata
        )
        return response

    async def undrain_backend(self, backend: str, model: str = "") -> pb.UndrainBackendResponse:
        """Admins: let a drained backend take requests again."""
        response: pb.UndrainBackendResponse = await self._stub.UndrainBackend(
            pb.UndrainBackendRequest(model=model, backend=backend), metadata=self._metadata
        )
        return response

    async def stream_text(self, model: str, prompt: str = "", **kwargs: Any) -> AsyncIterator[str]:
        """Just the generated text chunks of a streamed generation."""
        async for event in self.stream(model, prompt, **kwargs):
            if event.HasField("delta"):
                yield event.delta.text


def retry_delay(error: grpc.RpcError) -> float | None:
    """The server's suggested retry delay in seconds (google.rpc.RetryInfo), if it sent one."""
    return from_rpc_error(error).retry_delay


def error_reason(error: grpc.RpcError) -> str | None:
    """The machine-readable reason (google.rpc.ErrorInfo.reason: an `ErrorReason` value name), e.g. "QUEUE_FULL"."""
    return from_rpc_error(error).reason


def is_retryable(error: grpc.RpcError) -> bool:
    """Whether the same request may succeed when sent again (after `retry_delay` when it is not None), by the
    error table of llmsched.v1; an error without a reason this client knows is not retryable."""
    return from_rpc_error(error).retryable

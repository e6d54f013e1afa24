"""`SchedulerClient`: the raw asyncio layer (protobuf messages, gRPC errors, no retries) with identity on every
call, and helpers to read error details (which follow the error table of `llmsched.v1.errors`). Applications
want `AsyncClient` or `Client`, which add typed events and errors, retries and deadlines."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from clients._connection import aio_channel, channel_credentials, generation_params, identity_metadata
from llmsched.v1 import scheduler_pb2 as pb
from llmsched.v1 import scheduler_pb2_grpc as pb_grpc
from llmsched.v1.errors import ERROR_DOMAIN
from llmsched.v1.errors import is_retryable as _reason_is_retryable


class SchedulerClient:
    """Talks to one llm-scheduler. Pass `user` (sent as `x-user-id`) or `api_key` (sent as a bearer key).

    TLS: `tls=True` verifies the server against the system's CAs, `root_certificates` (PEM) against a
    private CA (and implies TLS); `certificate_chain` with `private_key` (PEM) present a client
    certificate for mutual TLS.
    """

    def __init__(
        self,
        target: str,
        *,
        user: str | None = None,
        api_key: str | None = None,
        tls: bool = False,
        root_certificates: bytes | None = None,
        certificate_chain: bytes | None = None,
        private_key: bytes | None = None,
    ) -> None:
        credentials = channel_credentials(tls, root_certificates, certificate_chain, private_key)
        self._channel = aio_channel(target, credentials)
        self._stub = pb_grpc.SchedulerServiceStub(self._channel)
        self._metadata = identity_metadata(user, api_key)

    async def __aenter__(self) -> SchedulerClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(None)

    async def submit(
        self,
        model: str,
        prompt: str = "",
        *,
        messages: Sequence[tuple[str, str]] = (),
        timeout: float | None = None,
        **fields: Any,
    ) -> pb.SubmitResponse:
        """Run one generation and return the whole answer. `fields`: any GenerationParams field."""
        request = pb.SubmitRequest(params=generation_params(model, prompt, messages, fields))
        response: pb.SubmitResponse = await self._stub.Submit(request, metadata=self._metadata, timeout=timeout)
        return response

    def stream(
        self,
        model: str,
        prompt: str = "",
        *,
        messages: Sequence[tuple[str, str]] = (),
        timeout: float | None = None,
        **fields: Any,
    ) -> grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]:
        """Start a streamed generation; iterate the returned call for events, `.cancel()` it to abort.
        `fields`: any GenerationParams field."""
        request = pb.StreamRequest(params=generation_params(model, prompt, messages, fields))
        return self._stub.Stream(request, metadata=self._metadata, timeout=timeout)

    async def queue_state(
        self, model: str = "", user: str = "", max_users: int | None = None
    ) -> pb.GetQueueStateResponse:
        """Queue depths, gate states and fair-share counters (admins only when admin_users is set); only
        `user` when given, at most `max_users` users per class (None: the server's default)."""
        response: pb.GetQueueStateResponse = await self._stub.GetQueueState(
            pb.GetQueueStateRequest(model=model, user=user, max_users=max_users), metadata=self._metadata
        )
        return response

    async def stream_text(self, model: str, prompt: str = "", **kwargs: Any) -> AsyncIterator[str]:
        """Just the generated text chunks of a streamed generation."""
        async for event in self.stream(model, prompt, **kwargs):
            if event.HasField("delta"):
                yield event.delta.text


def _details(error: grpc.aio.AioRpcError) -> list[Any]:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    return list(status.details) if status is not None else []


def retry_delay(error: grpc.aio.AioRpcError) -> float | None:
    """The server's suggested retry delay in seconds (google.rpc.RetryInfo), if it sent one."""
    for detail in _details(error):
        info = error_details_pb2.RetryInfo()
        if detail.Is(info.DESCRIPTOR) and detail.Unpack(info):
            return float(info.retry_delay.ToNanoseconds()) / 1e9
    return None


def error_reason(error: grpc.aio.AioRpcError) -> str | None:
    """The machine-readable reason (google.rpc.ErrorInfo.reason: an `ErrorReason` value name), e.g. "QUEUE_FULL"."""
    for detail in _details(error):
        info = error_details_pb2.ErrorInfo()
        if detail.Is(info.DESCRIPTOR) and detail.Unpack(info) and info.domain == ERROR_DOMAIN:
            return str(info.reason)
    return None


def is_retryable(error: grpc.aio.AioRpcError) -> bool:
    """Whether the same request may succeed when sent again (after `retry_delay` when it is not None), by the
    error table of llmsched.v1; an error without a reason this client knows is not retryable."""
    return _reason_is_retryable(error_reason(error))

"""`Connection`: an asyncio channel to one scheduler with the caller's identity, under every Python client
(`SchedulerClient` and `AsyncClient` directly; `Client` through its `AsyncClient`)."""

from __future__ import annotations

from typing import Self

import grpc

from llmsched.v1 import scheduler_pb2_grpc as pb_grpc


class Connection:
    """A channel to one scheduler; an async context manager that closes it.

    Identity: `api_key` (sent as a bearer key) or `user` (sent as `x-user-id`); the server decides which one
    counts (keys when they are on). TLS: `tls=True` verifies the server against the system's CAs,
    `root_certificates` (PEM) against a private CA (and implies TLS); `certificate_chain` with `private_key`
    (PEM) present a client certificate for mutual TLS.
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
        aio = grpc.aio
        self._channel = aio.secure_channel(target, credentials) if credentials else aio.insecure_channel(target)
        self._stub = pb_grpc.SchedulerServiceStub(self._channel)
        self._metadata = identity_metadata(user, api_key)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(None)


def identity_metadata(user: str | None, api_key: str | None) -> tuple[tuple[str, str], ...]:
    """`x-user-id` and/or `authorization: Bearer`."""
    metadata: list[tuple[str, str]] = []
    if user:
        metadata.append(("x-user-id", user))
    if api_key:
        metadata.append(("authorization", f"Bearer {api_key}"))
    return tuple(metadata)


def channel_credentials(
    tls: bool, root_certificates: bytes | None, certificate_chain: bytes | None, private_key: bytes | None
) -> grpc.ChannelCredentials | None:
    """TLS credentials, or None for a plaintext channel."""
    if (certificate_chain is None) != (private_key is None):
        raise ValueError("a client certificate needs both certificate_chain and private_key")
    if tls or root_certificates is not None or certificate_chain is not None:
        return grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
    return None

"""What the sync and asyncio clients share before any I/O: identity metadata, TLS credentials, the asyncio
channel, and the request messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from llmsched.v1 import scheduler_pb2 as pb


def identity_metadata(user: str | None, api_key: str | None) -> tuple[tuple[str, str], ...]:
    """`x-user-id` and/or `authorization: Bearer` (the server decides which one counts: keys when on)."""
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


def aio_channel(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
    """An asyncio channel to `target`, over TLS when `credentials` are given."""
    return grpc.aio.secure_channel(target, credentials) if credentials else grpc.aio.insecure_channel(target)


def generation_params(
    model: str, prompt: str, messages: Sequence[tuple[str, str]], fields: dict[str, Any]
) -> pb.GenerationParams:
    """`fields`: any other GenerationParams field by name (max_tokens, priority_class, request_id, ...)."""
    return pb.GenerationParams(
        model=model, prompt=prompt, messages=[pb.ChatMessage(role=r, content=c) for r, c in messages], **fields
    )

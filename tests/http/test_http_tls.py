"""The HTTP door on the gRPC listener's TLS settings: HTTPS only, mTLS, and the certificate as identity."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path

import aiohttp
import pytest
import trustme

from tests.client_certs import issue_client_cert
from tests.helpers import ControlledEngine, eventually, queue_depth
from tests.http.support import chat, http_serving


@pytest.fixture
def ca(tmp_path: Path) -> tuple[trustme.CA, dict[str, str]]:
    """A throwaway CA and the `[server]` settings of a mutual-TLS service certified by it."""
    authority = trustme.CA()
    cert = authority.issue_cert("127.0.0.1")
    files = {name: str(tmp_path / name) for name in ("server.pem", "server.key", "ca.pem")}
    cert.private_key_pem.write_to_path(files["server.key"])
    cert.cert_chain_pems[0].write_to_path(files["server.pem"])
    authority.cert_pem.write_to_path(files["ca.pem"])
    server = {"tls_cert_file": files["server.pem"], "tls_key_file": files["server.key"]}
    return authority, {**server, "tls_client_ca_file": files["ca.pem"]}


def _client_context(authority: trustme.CA, *identities: str, common_name: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    authority.configure_trust(context)
    if identities or common_name:
        issue_client_cert(authority, *identities, common_name=common_name).configure_cert(context)
    return context


async def test_mtls_and_the_client_certificate_identity_over_http(ca: tuple[trustme.CA, dict[str, str]]) -> None:
    authority, server_tls = ca
    engine = ControlledEngine(waiting=50)  # requests stay queued, where their user can be read
    async with (
        http_serving(engine.factory(), server=server_tls, auth={"identity_from_client_cert": True}) as (server, base),
        aiohttp.ClientSession() as session,
    ):
        url = base.replace("http://", "https://") + "/v1/chat/completions"
        with pytest.raises(aiohttp.ClientError):  # plaintext is not served
            async with session.post(base + "/v1/chat/completions", json=chat()) as response:
                await response.read()
        with pytest.raises(aiohttp.ClientError):  # no client certificate: refused in the handshake
            async with session.post(url, json=chat(), ssl=_client_context(authority)) as response:
                await response.read()
        for context, user in [
            (_client_context(authority, "svc-a.example", common_name="ignored-cn"), "svc-a.example"),
            (_client_context(authority, common_name="batch-worker"), "batch-worker"),
        ]:
            request = asyncio.create_task(_post(session, url, context))  # x-user-id: root, ignored
            await eventually(lambda: queue_depth(server, user) == 1, what=f"{user} queued")  # noqa: B023
            assert queue_depth(server, "root") == 0
            request.cancel()  # the client leaves: its request leaves the queue
            with contextlib.suppress(asyncio.CancelledError):
                await request
            await eventually(lambda: queue_depth(server) == 0, what="queue empty")


async def _post(session: aiohttp.ClientSession, url: str, context: ssl.SSLContext) -> int:
    async with session.post(url, json=chat(), ssl=context, headers={"x-user-id": "root"}) as response:
        return response.status

"""The HTTP door's refusals speak HTTP: they name the header to send (the configured user header, or
`Authorization: Bearer` with keys), never gRPC's metadata; the gRPC door keeps its own words."""

from __future__ import annotations

import hashlib
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from scheduler_svc.config import AuthConfig
from scheduler_svc.core.auth import GRPC, Authenticator, http_wording
from scheduler_svc.core.errors import Unauthenticated
from tests.helpers import ControlledEngine
from tests.http.support import chat, http_serving

CHAT = "/v1/chat/completions"


async def _message(
    session: aiohttp.ClientSession, url: str, headers: CIMultiDict[str] | dict[str, str] | None = None
) -> tuple[int, str]:
    async with session.post(url, json=chat(), headers=headers or {}) as response:
        body: dict[str, Any] = await response.json()
        return response.status, body["error"]["message"]


async def test_a_call_without_identity_is_told_which_header_to_send() -> None:
    engine = ControlledEngine(auto_release=True)
    async with http_serving(engine.factory()) as (_, base), aiohttp.ClientSession() as session:
        missing = await _message(session, base + CHAT)
        twice = await _message(session, base + CHAT, CIMultiDict([("x-user-id", "bob"), ("x-user-id", "eve")]))
    assert missing == (401, "missing caller identity: send the `x-user-id: <user>` header")
    assert twice[0] == 401 and twice[1] == "header `x-user-id` sent more than once"


async def test_the_configured_user_header_is_the_one_named() -> None:
    engine = ControlledEngine(auto_release=True)
    server = {"http_user_header": "x-forwarded-user"}
    async with http_serving(engine.factory(), server=server) as (_, base), aiohttp.ClientSession() as session:
        status, message = await _message(session, base + CHAT, {"x-user-id": "bob"})
    assert status == 401 and message == "missing caller identity: send the `x-forwarded-user: <user>` header"


async def test_with_keys_the_authorization_header_is_named() -> None:
    engine = ControlledEngine(auto_release=True)
    auth = {"api_key_sha256": {hashlib.sha256(b"alice-key").hexdigest(): "alice"}}
    async with http_serving(engine.factory(), auth=auth) as (_, base), aiohttp.ClientSession() as session:
        status, message = await _message(session, base + CHAT, {"x-user-id": "alice"})
    assert status == 401 and message == "missing API key: send the `Authorization: Bearer <key>` header"
    assert "metadata" not in message


@pytest.mark.parametrize(
    ("wording", "expected"),
    [
        (GRPC, "missing caller identity: send metadata `x-user-id: <user>`"),
        (http_wording("x-user-id"), "missing caller identity: send the `x-user-id: <user>` header"),
    ],
)
def test_each_door_has_its_own_words(wording: Any, expected: str) -> None:
    with pytest.raises(Unauthenticated) as refused:
        Authenticator(AuthConfig()).identify([], wording=wording)
    assert str(refused.value) == expected

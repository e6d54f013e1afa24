"""Identity and transport: the user-id form, API key digests, TLS on every listener, mTLS identity.

Certificates are made at run time with `trustme` (a throwaway CA per test), so nothing secret or
expiring is checked in.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import aiohttp
import grpc
import pytest
import trustme

from clients import SchedulerClient, error_reason
from llmsched.v1 import scheduler_pb2 as pb
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.config import AuthConfig, ConfigError
from scheduler_svc.core.auth import Authenticator
from scheduler_svc.core.errors import Unauthenticated
from scheduler_svc.core.keys import key_digest
from tests.client_certs import issue_client_cert
from tests.helpers import ControlledEngine, client_for, make_config, queue_depth, queued_users, serving, until_settled
from tests.stream_events import event_or_end

ROOT = Path(__file__).resolve().parents[2]
GRPCURL = str(Path(sys.executable).parent / "grpcurl")
MINIMAL: dict[str, Any] = {"models": [{"name": "m", "backends": [{"name": "b", "url": "http://127.0.0.1:8000"}]}]}


class ClientTls(TypedDict):
    """SchedulerClient's keyword arguments for a TLS channel with a client certificate."""

    root_certificates: bytes
    certificate_chain: bytes
    private_key: bytes


@dataclass
class Pki:
    """A throwaway CA, the service's certificate files, and a way to issue client certificates."""

    ca: trustme.CA
    dir: Path
    cert_file: str
    key_file: str
    ca_file: str

    @property
    def ca_pem(self) -> bytes:
        return self.ca.cert_pem.bytes()

    def client(self, *identities: str, common_name: str | None = None) -> ClientTls:
        """SchedulerClient keyword arguments presenting a client certificate from this CA."""
        cert = issue_client_cert(self.ca, *identities, common_name=common_name)
        return {
            "root_certificates": self.ca_pem,
            "certificate_chain": b"".join(blob.bytes() for blob in cert.cert_chain_pems),
            "private_key": cert.private_key_pem.bytes(),
        }

    def server(self, *, mutual: bool = False) -> dict[str, str]:
        """The `[server]` TLS settings for this PKI."""
        settings = {"tls_cert_file": self.cert_file, "tls_key_file": self.key_file}
        return {**settings, "tls_client_ca_file": self.ca_file} if mutual else settings


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = {name: tmp_path / name for name in ("server.pem", "server.key", "ca.pem")}
    cert.private_key_pem.write_to_path(str(paths["server.key"]))
    cert.cert_chain_pems[0].write_to_path(str(paths["server.pem"]))
    ca.cert_pem.write_to_path(str(paths["ca.pem"]))
    return Pki(ca, tmp_path, str(paths["server.pem"]), str(paths["server.key"]), str(paths["ca.pem"]))


async def _queued_as(server: SchedulerServer, client: SchedulerClient) -> list[str]:
    """Queue one request with `client` (the engine is busy) and return the users with queued work."""
    call = client.stream("m", "x")
    try:
        first = await event_or_end(call)
        assert first is not None and first.HasField("queued")
        return queued_users(server)
    finally:
        call.cancel()


# --- the user-id form ---------------------------------------------------------------------------------


async def test_user_ids_outside_the_form_are_refused_not_trimmed() -> None:
    engine = ControlledEngine(auto_release=True)
    refused = [" alice", "alice ", "a b", "-alice", ".alice", "al'ice", "x" * 129, "a\\b"]
    accepted = ["alice", "alice@example.com", "svc:batch/worker-1", "A.b_c+d", "7" * 128]
    async with serving(make_config(), engine.factory()) as server:
        for user in refused:
            async with client_for(server, user=user) as client:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await client.submit("m", "x")
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, user
            details = err.value.details() or ""
            assert "invalid user id" in details and "A-Z a-z 0-9" in details, details
            assert len(details) < 300 and error_reason(err.value) == "UNAUTHENTICATED"
        for user in accepted:
            async with client_for(server, user=user) as client:
                await client.submit("m", "x")
    assert len(engine.finished) == len(accepted)


async def test_a_non_ascii_byte_in_x_user_id_is_refused_and_shown_escaped() -> None:
    """grpcio cannot send a 0xFF byte in metadata; grpcurl (Go) can, and the server decodes it as latin-1."""
    engine = ControlledEngine(auto_release=True)
    async with serving(make_config(), engine.factory()) as server:
        process = await asyncio.create_subprocess_exec(
            GRPCURL.encode(), b"-plaintext", b"-H", b"x-user-id: al\xffice",
            b"-d", b'{"params": {"model": "m", "prompt": "x"}}',
            server.address.encode(), b"llmsched.v1.SchedulerService/Submit",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(process.communicate(), 60)
    text = out.decode(errors="replace")
    assert process.returncode != 0 and "Unauthenticated" in text, text
    assert "al\\\\xffice" in text or "al\\xffice" in text, text  # escaped, never the raw byte
    assert engine.started == []


@pytest.mark.parametrize("user", ["al\xffice", "al\x00ice", "alice\t", "\u00e9mile", "al\u200bice", ""])
def test_identify_refuses_control_and_non_ascii_characters(user: str) -> None:
    with pytest.raises(Unauthenticated) as err:
        Authenticator(AuthConfig()).identify([("x-user-id", user)])
    assert "invalid user id" in str(err.value)
    assert user not in str(err.value) or user == ""  # shown escaped


async def test_a_second_x_user_id_is_refused() -> None:
    """A proxy that appends its own x-user-id after the client's must not lose to the client's."""
    engine = ControlledEngine(auto_release=True)
    async with serving(make_config(), engine.factory()) as server, client_for(server, user="mallory") as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client._stub.Submit(
                pb.SubmitRequest(params=pb.GenerationParams(model="m", prompt="x")),
                metadata=(("x-user-id", "root"), ("x-user-id", "bob")),
            )
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "more than once" in (err.value.details() or "")


# --- API keys: digests, file, environment ------------------------------------------------------------


async def test_keys_from_digests_a_file_and_the_environment(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    keys_file = pki.dir / "api-keys"
    keys_file.write_text(
        f"# user key\nalice sk-from-file\n\nbob sha256:{key_digest('sk-bob-digest-in-file').upper()}\n"
    )
    monkeypatch.setenv("LLMSCHED_TEST_KEYS", "carol sk-from-env\n")
    auth = {
        "api_key_sha256": {key_digest("sk-dave"): "dave"},
        "api_keys_file": str(keys_file),
        "api_keys_env": "LLMSCHED_TEST_KEYS",
    }
    engine = ControlledEngine(waiting=50)
    async with serving(make_config(auth=auth), engine.factory()) as server:
        for key, user in [
            ("sk-from-file", "alice"),
            ("sk-bob-digest-in-file", "bob"),
            ("sk-from-env", "carol"),
            ("sk-dave", "dave"),
        ]:
            async with client_for(server, user="root", api_key=key) as client:
                assert await _queued_as(server, client) == [user]
            await _wait_empty(server)
        for bad_key in ("sk-wrong", key_digest("sk-dave"), "sk-from-file ", None):
            async with client_for(server, user="alice", api_key=bad_key) as client:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await client.submit("m", "x")
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, key


async def _wait_empty(server: SchedulerServer) -> None:
    await until_settled(server, lambda: queue_depth(server) == 0)


def test_every_key_digest_is_compared_whichever_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    """No early exit: how long a lookup takes must not tell which key (if any) matched."""
    auth = AuthConfig(api_key_sha256={key_digest(f"sk-{i}"): f"user{i}" for i in range(5)})
    authenticator = Authenticator(auth)
    calls: list[int] = []
    compare = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(1)
        return compare(a, b)

    monkeypatch.setattr("scheduler_svc.core.auth.hmac.compare_digest", counting)
    for key, user in [("sk-0", "user0"), ("sk-4", "user4")]:
        calls.clear()
        assert authenticator.identify([("authorization", f"Bearer {key}")]) == user
        assert len(calls) == 5
    calls.clear()
    with pytest.raises(Unauthenticated):
        authenticator.identify([("authorization", "Bearer sk-9")])
    assert len(calls) == 5


# --- TLS and mTLS --------------------------------------------------------------------------------------


async def test_tls_grpc_works_with_the_ca_and_fails_without_it(pki: Pki) -> None:
    engine = ControlledEngine(auto_release=True)
    other_ca = trustme.CA().cert_pem.bytes()
    async with serving(make_config(server=pki.server()), engine.factory()) as server:
        async with client_for(server, root_certificates=pki.ca_pem) as client:
            response = await client.submit("m", "x")
        assert response.usage.completion_tokens == 3
        for kwargs in ({}, {"root_certificates": other_ca}, {"tls": True}):
            async with client_for(server, **kwargs) as client:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await client.submit("m", "x", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, kwargs
    assert len(engine.finished) == 1


async def test_metrics_are_served_over_https_only(pki: Pki) -> None:
    async with serving(make_config(server=pki.server())) as server:
        url = f"127.0.0.1:{server.metrics_port}/metrics"
        trusted = ssl.create_default_context(cafile=pki.ca_file)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"https://{url}", ssl=trusted) as response:
                assert response.status == 200
                assert "llmsched_" in await response.text()
            with pytest.raises(aiohttp.ClientError):
                async with session.get(f"http://{url}") as response:
                    await response.read()
            with pytest.raises(aiohttp.ClientError):  # the system CAs do not vouch for a private CA
                async with session.get(f"https://{url}") as response:
                    await response.read()


async def test_mtls_refuses_clients_without_a_certificate_on_every_listener(pki: Pki) -> None:
    engine = ControlledEngine(auto_release=True)
    async with serving(make_config(server=pki.server(mutual=True)), engine.factory()) as server:
        async with client_for(server, root_certificates=pki.ca_pem) as client:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.submit("m", "x", timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        stranger = trustme.CA().issue_cert("stranger.example")  # a certificate, but not from the client CA
        async with client_for(
            server,
            root_certificates=pki.ca_pem,
            certificate_chain=stranger.cert_chain_pems[0].bytes(),
            private_key=stranger.private_key_pem.bytes(),
        ) as client:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.submit("m", "x", timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        async with client_for(server, **pki.client("worker.example")) as client:
            await client.submit("m", "x")  # the CA's client: served (identity still from x-user-id here)
        url = f"https://127.0.0.1:{server.metrics_port}/metrics"
        anonymous = ssl.create_default_context(cafile=pki.ca_file)
        with_cert = ssl.create_default_context(cafile=pki.ca_file)
        pki.ca.issue_cert("prometheus.example").configure_cert(with_cert)
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientError):
                async with session.get(url, ssl=anonymous) as response:
                    await response.read()
            async with session.get(url, ssl=with_cert) as response:
                assert response.status == 200
    assert len(engine.finished) == 1


async def test_the_client_certificate_identity_becomes_the_user(pki: Pki) -> None:
    config = make_config(server=pki.server(mutual=True), auth={"identity_from_client_cert": True})
    engine = ControlledEngine(waiting=50)
    async with serving(config, engine.factory()) as server:
        cases = [
            (pki.client("svc-a.example", common_name="ignored-cn"), "svc-a.example"),
            (pki.client("ops@example.com", "svc-b.example"), "svc-b.example"),  # e-mail SANs are skipped
            (pki.client(common_name="batch-worker"), "batch-worker"),  # no SAN: the subject CN
        ]
        for credentials, user in cases:
            async with client_for(server, user="root", **credentials) as client:  # x-user-id is ignored
                assert await _queued_as(server, client) == [user]
            await _wait_empty(server)


async def test_a_certificate_identity_outside_the_user_id_form_is_unauthenticated(pki: Pki) -> None:
    config = make_config(server=pki.server(mutual=True), auth={"identity_from_client_cert": True})
    engine = ControlledEngine(auto_release=True)
    async with serving(config, engine.factory()) as server:
        for credentials in (pki.client(common_name="bad user"), pki.client(common_name="-dash")):
            async with client_for(server, **credentials) as client:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await client.submit("m", "x")
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "client certificate: invalid user id" in (err.value.details() or "")
    assert engine.started == []


async def test_cli_speaks_mtls_and_hashes_keys(pki: Pki) -> None:
    config = make_config(
        server=pki.server(mutual=True), auth={"identity_from_client_cert": True, "admin_users": ["ops.example"]}
    )
    cert = pki.ca.issue_cert("ops.example")
    cert_file, key_file = pki.dir / "ops.pem", pki.dir / "ops.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "scheduler_svc.app.cli"]
    async with serving(config) as server:
        process = await asyncio.create_subprocess_exec(
            *cli, "queue-state", "--target", server.address, "--ca-cert", pki.ca_file,
            "--client-cert", str(cert_file), "--client-key", str(key_file),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    assert json.loads(out)["models"][0]["model"] == "m"
    hashing = await asyncio.create_subprocess_exec(
        *cli, "hash-key", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env
    )
    out, _ = await asyncio.wait_for(hashing.communicate(b"sk-secret\n"), 60)
    assert out.decode().strip() == hashlib.sha256(b"sk-secret").hexdigest()


# --- configuration errors ------------------------------------------------------------------------------


def _with(**sections: dict[str, Any]) -> dict[str, Any]:
    return {**MINIMAL, **sections}


def test_plain_text_api_keys_are_refused_with_their_digests() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(_with(auth={"api_keys": {"sk-alice-123": "alice"}}))
    message = str(err.value)
    assert "api_key_sha256" in message and "sha256sum" in message and "api_keys_file" in message
    assert f'"{key_digest("sk-alice-123")}" = "alice"' in message


def test_admin_users_need_keys_client_certificates_or_an_explicit_opt_in(pki: Pki) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(_with(auth={"admin_users": ["root"]}))
    assert "trust_user_header" in str(err.value) and "api_key_sha256" in str(err.value)
    config_from_dict(_with(auth={"admin_users": ["root"], "trust_user_header": True}))
    config_from_dict(_with(auth={"admin_users": ["root"], "api_key_sha256": {key_digest("k"): "root"}}))
    config_from_dict(
        _with(server=pki.server(mutual=True), auth={"admin_users": ["root"], "identity_from_client_cert": True})
    )


def test_tls_settings_are_checked_at_load(pki: Pki) -> None:
    other = trustme.CA().issue_cert("127.0.0.1")
    mismatched_key = pki.dir / "other.key"
    other.private_key_pem.write_to_path(str(mismatched_key))
    not_pem = pki.dir / "not.pem"
    not_pem.write_text("hello")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tls_cert_file": pki.cert_file}, "set both"),
        ({"tls_key_file": pki.key_file}, "set both"),
        ({"tls_client_ca_file": pki.ca_file}, "needs server.tls_cert_file"),
        ({"tls_cert_file": pki.cert_file, "tls_key_file": str(pki.dir / "missing.key")}, "cannot read"),
        ({"tls_cert_file": pki.cert_file, "tls_key_file": str(mismatched_key)}, "server TLS"),
        ({**pki.server(), "tls_client_ca_file": str(not_pem)}, "not a PEM file"),
    ]
    for server, message in cases:
        with pytest.raises(ConfigError) as err:
            config_from_dict(_with(server=server))
        assert message in str(err.value), (server, str(err.value))
    config_from_dict(_with(server=pki.server(mutual=True)))


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ({"identity_from_client_cert": True}, "needs server.tls_client_ca_file"),
        ({"admin_users": ["root "], "trust_user_header": True}, "auth.admin_users: invalid user id 'root '"),
        ({"api_key_sha256": {key_digest("k"): "bad user"}}, "invalid user id 'bad user'"),
        ({"api_key_sha256": {"sk-plain-key": "alice"}}, "64 hex digits"),
        ({"api_key_sha256": {key_digest("k"): "alice", key_digest("k").upper(): "bob"}}, "the same key"),
        ({"api_keys_env": "LLMSCHED_TEST_UNSET_VARIABLE"}, "is not set"),
        ({"api_keys_file": "/nonexistent/keys"}, "cannot read"),
    ],
)
def test_invalid_auth_settings_are_refused(auth: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(_with(auth=auth))
    assert message in str(err.value)


def test_key_files_and_weights_are_checked_at_load(pki: Pki) -> None:
    keys_file = pki.dir / "keys"
    for text, message in [
        ("# only comments\n\n", "no keys found"),
        ("alice\n", "line 1: expected `<user> <key>`"),
        ("alice sk-1 extra\n", "line 1: expected"),
        ("alice sk-1\n\u00e9mile sk-2\n", "line 2: invalid user id '\\xe9mile'"),
        ("alice sha256:abc\n", "line 1: a sha256: entry needs 64 hex digits"),
    ]:
        keys_file.write_text(text)
        with pytest.raises(ConfigError) as err:
            config_from_dict(_with(auth={"api_keys_file": str(keys_file)}))
        assert message in str(err.value)
        assert "sk-" not in str(err.value)  # a key is never echoed
    with pytest.raises(ConfigError, match=r"scheduling\.weights\.users: invalid user id"):
        config_from_dict(_with(scheduling={"weights": {"users": {" alice": 2.0}}}))
    with pytest.raises(ConfigError, match="mutual TLS"):
        config_from_dict(_with(server=pki.server(), auth={"identity_from_client_cert": True}))
    with pytest.raises(ConfigError, match="cannot be combined with API keys"):
        config_from_dict(
            _with(
                server=pki.server(mutual=True),
                auth={"identity_from_client_cert": True, "api_key_sha256": {key_digest("k"): "alice"}},
            )
        )

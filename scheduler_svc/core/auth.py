"""Who is calling: an API key, the client certificate, or (trusted callers only) the `x-user-id` header.

The source is chosen by the configuration, never by the caller:
- API keys configured: `authorization: Bearer <key>` alone decides the user; `x-user-id` is ignored.
- `auth.identity_from_client_cert`: the mTLS client certificate's first DNS or URI SAN, else its subject CN
  (config load refuses this together with API keys, so there is no precedence to get wrong).
- Otherwise: the user states itself in `x-user-id` (internal callers, or a trusted proxy that sets it).
Every identity must have the form of `scheduler_svc.core.identity`; anything else is UNAUTHENTICATED.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from scheduler_svc.config import AuthConfig
from scheduler_svc.core.errors import Unauthenticated
from scheduler_svc.core.identity import user_id_problem
from scheduler_svc.core.keys import load_key_digests

USER_HEADER = "x-user-id"
AUTH_HEADER = "authorization"

PeerInfo = Mapping[str, Iterable[bytes]]
"""gRPC's auth context: property name -> values (`x509_common_name`, `peer_dns`, ...)."""


@dataclass(frozen=True)
class Wording:
    """How a refusal tells the caller what to send, in its own protocol's words: gRPC metadata, or HTTP
    headers (where the user header is the door's configured one and the key goes in `Authorization`)."""

    carrier: str = "metadata"  # "metadata" (gRPC) or "header" (HTTP)
    user_header: str = USER_HEADER

    def send(self, name: str, value: str) -> str:
        if self.carrier == "metadata":
            return f"send metadata `{name}: {value}`"
        return f"send the `{name}: {value}` header"

    def name(self, name: str) -> str:
        """The name of a header as this protocol's callers write it."""
        if self.carrier == "metadata":
            return name
        return self.user_header if name == USER_HEADER else "-".join(p.capitalize() for p in name.split("-"))


GRPC = Wording()


def http_wording(user_header: str) -> Wording:
    """The HTTP door's wording: headers, with the door's configured user header."""
    return Wording("header", user_header)


class Authenticator:
    """Maps a call's metadata (and, with mTLS, its peer certificate) to a user id."""

    def __init__(self, config: AuthConfig) -> None:
        self._from_cert = config.identity_from_client_cert
        self.use(config)

    def use(self, config: AuthConfig) -> None:
        """The keys of a (reloaded) configuration, for the calls from now on; raises ConfigError when a key
        file or variable cannot be read. Whether identity comes from certificates is set at start."""
        self._digests = [(bytes.fromhex(digest), user) for digest, user in load_key_digests(config).items()]

    def identify(
        self,
        metadata: Iterable[tuple[str, str | bytes]] | None,
        peer: Callable[[], PeerInfo] | None = None,
        wording: Wording = GRPC,
    ) -> str:
        """The caller's user id; `peer` returns the call's auth context (only read for cert identity);
        `wording` says how a refusal names what to send (gRPC metadata by default)."""
        headers = _headers(metadata, wording)
        if self._digests:
            return self._user_for_key(headers.get(AUTH_HEADER, ""), wording)
        if self._from_cert:
            return _user_from_certificate(peer() if peer is not None else {})
        user = headers.get(USER_HEADER)
        if user is None:
            raise Unauthenticated(f"missing caller identity: {wording.send(wording.name(USER_HEADER), '<user>')}")
        if problem := user_id_problem(user):
            raise Unauthenticated(f"`{wording.name(USER_HEADER)}`: {problem}")
        return user

    def _user_for_key(self, header: str, wording: Wording) -> str:
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key:
            raise Unauthenticated(f"missing API key: {wording.send(wording.name(AUTH_HEADER), 'Bearer <key>')}")
        digest = hashlib.sha256(key.encode()).digest()
        found: str | None = None
        for known, user in self._digests:  # every digest, in constant time: no early exit tells which matched
            if hmac.compare_digest(known, digest):
                found = user
        if found is None:
            raise Unauthenticated("unknown API key")
        return found


def _headers(metadata: Iterable[tuple[str, str | bytes]] | None, wording: Wording) -> dict[str, str]:
    """Text metadata by lower-case name. An identity header sent twice is refused: a proxy that adds its
    own `x-user-id` after the client's must not lose to the client's."""
    headers: dict[str, str] = {}
    for key, value in metadata or ():
        if not isinstance(value, str):
            continue
        name = key.lower()
        if name in headers and name in (USER_HEADER, AUTH_HEADER):
            raise Unauthenticated(f"{wording.carrier} `{wording.name(name)}` sent more than once")
        headers.setdefault(name, value)
    return headers


def _user_from_certificate(peer: PeerInfo) -> str:
    """The first DNS or URI SAN of the client certificate, else its subject common name."""
    sans = list(peer.get("x509_subject_alternative_name", ()))
    typed = {*peer.get("peer_dns", ()), *peer.get("peer_uri", ())}
    names = [san for san in sans if san in typed] or list(peer.get("x509_common_name", ()))
    if not names:
        raise Unauthenticated("no client certificate identity (a DNS or URI SAN, or a subject CN) on this call")
    user = names[0].decode("utf-8", "backslashreplace")
    if problem := user_id_problem(user):
        raise Unauthenticated(f"client certificate: {problem}")
    return user

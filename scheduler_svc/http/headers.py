"""What the HTTP door reads from request headers: identity, request id, deadline, priority class, opt-ins.

Identity goes through the same `Authenticator` as gRPC metadata: with API keys, `Authorization: Bearer <key>`
alone decides the user; with `auth.identity_from_client_cert`, the TLS client certificate; otherwise the
configured trusted header (`server.http_user_header`, `x-user-id` by default). A body's `user` never does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from scheduler_svc.core.auth import USER_HEADER, Authenticator, PeerInfo, http_wording
from scheduler_svc.core.errors import InvalidRequest

REQUEST_ID_HEADER = "x-request-id"
TIMEOUT_MS_HEADER = "x-request-timeout-ms"
SDK_TIMEOUT_HEADERS = ("x-stainless-timeout", "x-stainless-read-timeout")  # seconds: the openai SDKs' own
PRIORITY_CLASS_HEADER = "x-priority-class"
QUEUE_UPDATES_HEADER = "x-queue-updates"
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600.0


def identify(
    auth: Authenticator, headers: Iterable[tuple[str, str]], user_header: str, peer: Mapping[str, Any] | None
) -> str:
    """The caller's user id (raises Unauthenticated, whose message names headers, not gRPC metadata). The
    configured user header stands in for gRPC's `x-user-id`; a client's own `x-user-id` then counts for
    nothing."""
    metadata: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        lower = name.lower()
        if lower == user_header:
            metadata.append((USER_HEADER, value))
        elif lower != USER_HEADER:
            metadata.append((lower, value))
    return auth.identify(metadata, lambda: peer_info(peer or {}), http_wording(user_header))


def peer_info(certificate: Mapping[str, Any]) -> PeerInfo:
    """A TLS client certificate as `ssl.SSLSocket.getpeercert()` gives it, in the form of gRPC's auth
    context, so certificate identity follows the one rule in `scheduler_svc.core.auth`."""
    sans = [(str(kind), str(value)) for kind, value in certificate.get("subjectAltName", ())]
    common_names = [str(value) for rdn in certificate.get("subject", ()) for key, value in rdn if key == "commonName"]
    return {
        "x509_subject_alternative_name": [value.encode() for _, value in sans],
        "peer_dns": [value.encode() for kind, value in sans if kind == "DNS"],
        "peer_uri": [value.encode() for kind, value in sans if kind == "URI"],
        "x509_common_name": [name.encode() for name in common_names],
    }


def timeout_seconds(headers: Mapping[str, str]) -> float | None:
    """The call's deadline from `x-request-timeout-ms`, else from the SDK's own timeout header (seconds).
    A malformed `x-request-timeout-ms` is a 400; a malformed SDK header is ignored (not the caller's words)."""
    raw = headers.get(TIMEOUT_MS_HEADER)
    if raw is not None:
        value = _positive(raw)
        if value is None:
            raise InvalidRequest(f"{TIMEOUT_MS_HEADER}: a positive number of milliseconds")
        return min(value / 1000, MAX_TIMEOUT_SECONDS)
    for name in SDK_TIMEOUT_HEADERS:
        if (raw := headers.get(name)) is not None and (value := _positive(raw)) is not None:
            return min(value, MAX_TIMEOUT_SECONDS)
    return None


def _positive(raw: str) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def wants_queue_updates(headers: Mapping[str, str]) -> bool:
    """Whether a streaming client opted in to queue-position comment lines."""
    return headers.get(QUEUE_UPDATES_HEADER, "").strip().lower() == "true"

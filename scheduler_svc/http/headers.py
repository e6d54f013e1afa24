"""What the HTTP door reads from request headers: identity, the body's media type, request id, deadline,
priority class, end user, opt-ins, and the caller's W3C trace context.

Identity goes through the same `Authenticator` as gRPC metadata: with API keys, `Authorization: Bearer <key>`
alone decides the user; with `auth.identity_from_client_cert`, the TLS client certificate; otherwise the
configured trusted header (`server.http_user_header`, `x-user-id` by default). A body's `user` never does.

Every header the door reads is taken once: sent twice it is refused (an identity header with 401, as gRPC
metadata is; any other with 400), never first-wins, and a value that is not UTF-8 is refused the same way.
The trace headers are the exception: they serve tracing only, so whatever is wrong with them (sent twice
included) is ignored, never refused (`scheduler_svc.core.trace_context`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from backends.base import TraceContext
from scheduler_svc.core.admission import END_USER_HEADER, agreed_end_user
from scheduler_svc.core.auth import AUTH_HEADER, USER_HEADER, Authenticator, PeerInfo, http_wording
from scheduler_svc.core.errors import InvalidField, Unauthenticated, UnsupportedContentType
from scheduler_svc.core.identity import user_id_problem
from scheduler_svc.core.text import client_text
from scheduler_svc.core.trace_context import TRACEPARENT, TRACESTATE, read_trace_context

CONTENT_TYPE_HEADER = "content-type"
JSON_MEDIA_TYPE = "application/json"
REQUEST_ID_HEADER = "x-request-id"
TIMEOUT_MS_HEADER = "x-request-timeout-ms"
SDK_TIMEOUT_HEADERS = ("x-stainless-timeout", "x-stainless-read-timeout")  # seconds: the openai SDKs' own
PRIORITY_CLASS_HEADER = "x-priority-class"
QUEUE_UPDATES_HEADER = "x-queue-updates"
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600.0
_MILLISECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")  # ASCII digits only: \d would take any script's


def identify(
    auth: Authenticator, headers: Iterable[tuple[str, str]], user_header: str, peer: Mapping[str, Any] | None
) -> str:
    """The caller's user id (raises Unauthenticated, whose message names headers, not gRPC metadata). The
    configured user header stands in for gRPC's `x-user-id`; a client's own `x-user-id` then counts for
    nothing."""
    metadata: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        lower = name.lower()
        if lower in (user_header, AUTH_HEADER) and not _utf8(value):
            raise Unauthenticated(f"`{lower}` is not valid UTF-8")
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


def single(headers: Mapping[str, str], name: str) -> str | None:
    """The value of header `name` (None: absent); InvalidField when it is sent more than once or is not
    UTF-8 (aiohttp hands undecodable bytes over as lone surrogates)."""
    getall = getattr(headers, "getall", None)
    values: list[str] = getall(name, []) if getall is not None else ([headers[name]] if name in headers else [])
    if len(values) > 1:
        raise InvalidField(name, "header sent more than once")
    if values and not _utf8(values[0]):
        raise InvalidField(name, "header value is not valid UTF-8")
    return values[0] if values else None


def _utf8(value: str | bytes) -> bool:
    if isinstance(value, bytes) or value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_json_body(headers: Mapping[str, str]) -> None:
    """Refuse (415, UnsupportedContentType) a body sent as anything but JSON, before any of it is read: its
    Content-Type must name `application/json` or a `+json` type (any parameters, any case). A request that
    names none is read as JSON (some clients leave it out); one that names another type (a form, text, a
    file upload, curl's `-d` without a Content-Type) would only be misread."""
    raw = single(headers, CONTENT_TYPE_HEADER)
    if raw is None:
        return
    media_type = raw.split(";", 1)[0].strip().lower()
    if not media_type or _is_json(media_type):
        return
    raise UnsupportedContentType(
        f"unsupported Content-Type {client_text(raw)}: this endpoint accepts only a JSON body; send it with "
        f"'Content-Type: {JSON_MEDIA_TYPE}'"
    )


def _is_json(media_type: str) -> bool:
    kind, _, subtype = media_type.partition("/")
    return kind == "application" and (subtype == "json" or (subtype.endswith("+json") and subtype != "+json"))


def call_timeout_seconds(headers: Mapping[str, str]) -> float | None:
    """The whole call's deadline from `x-request-timeout-ms` (None: none), as the OpenAI SDKs' `timeout` and
    a gRPC deadline bound a call: queued, and then while its answer is generated. The value is decimal digits,
    a fraction allowed (`1500`, `250.5`); anything else (a sign, an exponent, `_`, spaces inside, `nan`, other
    scripts' digits: what Python's float would take too) and zero are a 400."""
    raw = single(headers, TIMEOUT_MS_HEADER)
    if raw is None:
        return None
    if not _MILLISECONDS.fullmatch(raw) or (value := float(raw)) <= 0:
        raise InvalidField(TIMEOUT_MS_HEADER, "a positive number of milliseconds in decimal digits, e.g. 1500")
    return min(value / 1000, MAX_TIMEOUT_SECONDS)  # digits past any float read as inf: the cap


def timeout_seconds(headers: Mapping[str, str]) -> float | None:
    """How long the request may wait in the queue: the call's deadline (`x-request-timeout-ms`), else the
    SDK's own timeout header (seconds; the SDKs' timeout is per read, and nothing is read while a request is
    queued). A malformed `x-request-timeout-ms` is a 400; a malformed SDK header is ignored (not the
    caller's words)."""
    call = call_timeout_seconds(headers)
    if call is not None:
        return call
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


def trace_context(headers: Mapping[str, str]) -> TraceContext | None:
    """The caller's trace context (`traceparent`, `tracestate`); None without a valid `traceparent`."""
    getall = getattr(headers, "getall", None)
    if getall is None:  # a plain mapping holds one value per name
        parents = [headers[TRACEPARENT]] if TRACEPARENT in headers else []
        states = [headers[TRACESTATE]] if TRACESTATE in headers else []
    else:
        parents, states = getall(TRACEPARENT, ()), getall(TRACESTATE, ())
    if not parents:
        return None
    return read_trace_context([p if _utf8(p) else "" for p in parents], [s for s in states if _utf8(s)])


def end_user(headers: Mapping[str, str], from_body: str) -> str:
    """The end user the request is for: `x-end-user-id`, or the body's `user` (`from_body`); both given,
    they must agree (a proxy's header never silently loses to the body, nor the body to it)."""
    header = single(headers, END_USER_HEADER)
    if header is None:
        return from_body
    if problem := user_id_problem(header):
        raise InvalidField(END_USER_HEADER, problem)
    return agreed_end_user(from_body, header, field="user", carrier="header")


def wants_queue_updates(headers: Mapping[str, str]) -> bool:
    """Whether a streaming client opted in to queue-position comment lines."""
    return (single(headers, QUEUE_UPDATES_HEADER) or "").strip().lower() == "true"

"""A client's W3C Trace Context (`traceparent`, `tracestate`), read by either door and checked here.

The headers are the caller's words and serve tracing only: a valid `traceparent` makes the request's trace a
continuation of the caller's, and goes on to the engine (as the caller sent it while tracing is off, else as
the scheduler's own span under it); nothing else reads them. What is not valid by the W3C Trace Context
recommendation is ignored, never refused: the call goes on untraced by the client's trace.

- `traceparent`: exactly one, `version-traceid-parentid-flags` in lower-case hex; version `ff` is invalid,
  an all-zero trace id or parent id too; version 00 is exactly 55 characters. A later version is read by
  its version-00 fields (a longer value must continue with `-`) and forwarded in the version-00 form, as a
  version-00 participant does. At most `MAX_TRACEPARENT_CHARS`.
- `tracestate`: only with a valid `traceparent`; every value sent joined by commas, at most
  `MAX_TRACESTATE_CHARS` in all and `MAX_TRACESTATE_MEMBERS` keys, each `key=value` of the grammar, keys
  unique. Anything else drops the whole `tracestate` (the `traceparent` still counts).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from backends.base import TraceContext

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
MAX_TRACEPARENT_CHARS = 512  # a later version may add fields; nothing longer is read
MAX_TRACESTATE_CHARS = 512  # what the recommendation asks every participant to pass on
MAX_TRACESTATE_MEMBERS = 32

_TRACEPARENT_00 = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_KEY = r"(?:[a-z][a-z0-9_*/-]{0,255}|[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13})"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER = re.compile(rf"({_KEY})=({_VALUE})")
_OWS = " \t"


def read_trace_context(traceparent: Sequence[str], tracestate: Sequence[str]) -> TraceContext | None:
    """The caller's trace context from every value it sent of each header (None: none, or not valid)."""
    if len(traceparent) != 1:
        return None  # absent, or sent twice: which would be the caller's?
    parent = _traceparent(traceparent[0])
    if parent is None:
        return None
    return TraceContext(parent, _tracestate(tracestate))


def _traceparent(raw: str) -> str | None:
    """The version-00 form of a valid `traceparent`, else None."""
    if len(raw) > MAX_TRACEPARENT_CHARS:
        return None
    value = raw.strip(_OWS)
    match = _TRACEPARENT_00.match(value)
    if match is None:
        return None
    version, trace_id, parent_id, flags = match.groups()
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    if version == "00":
        return value if len(value) == 55 else None
    if len(value) > 55 and value[55] != "-":
        return None
    return f"00-{trace_id}-{parent_id}-{flags}"


def _tracestate(values: Sequence[str]) -> str:
    """The valid `tracestate` list in its compact form, else empty."""
    if not values or sum(len(v) + 1 for v in values) > MAX_TRACESTATE_CHARS + 1:
        return ""
    members: list[str] = []
    keys: set[str] = set()
    for part in ",".join(values).split(","):
        member = part.strip(_OWS)
        if not member:
            continue  # empty list members are allowed
        match = _MEMBER.fullmatch(member)
        if match is None or match.group(1) in keys:
            return ""
        keys.add(match.group(1))
        members.append(member)
    if len(members) > MAX_TRACESTATE_MEMBERS:
        return ""
    return ",".join(members)

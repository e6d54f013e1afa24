"""A caller's W3C Trace Context is read by the recommendation's rules and otherwise ignored, never refused:
`traceparent` exactly once, well formed, bounded; `tracestate` only beside it, bounded, dropped whole when any
member is malformed; a later version reduced to its version-00 fields."""

from __future__ import annotations

import pytest

from backends.base import TraceContext
from scheduler_svc.core.trace_context import MAX_TRACEPARENT_CHARS, MAX_TRACESTATE_MEMBERS, read_trace_context
from scheduler_svc.grpc.requests import trace_context as from_metadata
from scheduler_svc.http.headers import trace_context as from_headers

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{PARENT}-01"


@pytest.mark.parametrize(
    "value",
    [
        VALID,
        f"00-{TRACE}-{PARENT}-00",  # not sampled: still a context to continue
        f" {VALID}\t",  # optional whitespace around a header value
    ],
)
def test_a_valid_traceparent_is_kept_as_sent(value: str) -> None:
    context = read_trace_context([value], [])
    assert context == TraceContext(value.strip(), "")


@pytest.mark.parametrize(
    "value",
    [
        "",
        "garbage",
        VALID.upper(),  # upper-case hex
        f"ff-{TRACE}-{PARENT}-01",  # version ff is invalid
        f"00-{'0' * 32}-{PARENT}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"00-{TRACE}-{PARENT}-01-extra",  # version 00 is exactly 55 characters
        f"00-{TRACE[:-1]}-{PARENT}-01",  # short trace id
        f"00_{TRACE}_{PARENT}_01",
        f"01-{TRACE}-{PARENT}-01x",  # a later version must continue with '-'
        f"01-{TRACE}-{PARENT}-01-" + "a" * MAX_TRACEPARENT_CHARS,  # over the bound
        f"00-{TRACE}-{PARENT}-0g",
    ],
)
def test_an_invalid_traceparent_is_ignored(value: str) -> None:
    assert read_trace_context([value], ["k=v"]) is None


def test_a_traceparent_sent_twice_or_not_at_all_is_ignored() -> None:
    assert read_trace_context([VALID, VALID], []) is None
    assert read_trace_context([], ["k=v"]) is None


def test_a_later_version_is_read_by_its_version_00_fields() -> None:
    later = f"cc-{TRACE}-{PARENT}-01-what-the-future-adds"
    assert read_trace_context([later], []) == TraceContext(f"00-{TRACE}-{PARENT}-01")
    assert read_trace_context([f"cc-{TRACE}-{PARENT}-01"], []) == TraceContext(f"00-{TRACE}-{PARENT}-01")


def test_tracestate_is_joined_compacted_and_dropped_whole_when_malformed() -> None:
    assert read_trace_context([VALID], ["congo=t61rcWkgMzE", " rojo=00f067aa0ba902b7 ,, "]) == TraceContext(
        VALID, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    )
    assert read_trace_context([VALID], ["tenant@vendor=x"]) == TraceContext(VALID, "tenant@vendor=x")
    for bad in ("Upper=x", "k=", "k=a,k=b", "=v", "k=v=w,", "k=tab\there", "1abc=x", "k=" + "v" * 300):
        assert read_trace_context([VALID], [bad]) == TraceContext(VALID, ""), bad
    too_many = ",".join(f"k{i}=v" for i in range(MAX_TRACESTATE_MEMBERS + 1))
    assert read_trace_context([VALID], [too_many]) == TraceContext(VALID, "")
    too_long = ",".join(f"key{i}=" + "v" * 60 for i in range(9))  # 9 x 66 characters: over 512
    assert read_trace_context([VALID], [too_long]) == TraceContext(VALID, "")


def test_both_doors_read_the_same_headers() -> None:
    metadata = (("x-user-id", "alice"), ("traceparent", VALID), ("tracestate", "a=1"), ("tracestate", "b=2"))
    assert from_metadata(metadata) == TraceContext(VALID, "a=1,b=2")
    assert from_metadata((("x-user-id", "alice"),)) is None
    assert from_metadata((("traceparent", b"binary"),)) is None
    assert from_headers({"traceparent": VALID, "tracestate": "a=1"}) == TraceContext(VALID, "a=1")
    assert from_headers({"traceparent": "\udcff" + VALID[1:]}) is None  # not UTF-8 (aiohttp's surrogates)
    assert from_headers({}) is None

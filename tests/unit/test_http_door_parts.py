"""The HTTP door's pure parts: the error mapping follows the one table, headers, and the adapters' bodies
carrying the new sampling fields."""

from __future__ import annotations

import pytest

from backends import errors as backend_errors
from backends.adapters.openai_compat import openai_body
from backends.adapters.tgi import tgi_body
from backends.base import GenerationRequest, SamplingParams
from llmsched.v1 import scheduler_pb2 as pb
from llmsched.v1.errors import ERRORS
from scheduler_svc.core import errors
from scheduler_svc.grpc.requests import client_request
from scheduler_svc.http.errors import error_reply
from scheduler_svc.http.headers import MAX_TIMEOUT_SECONDS, call_timeout_seconds, peer_info, timeout_seconds
from scheduler_svc.http.parsing import parse_call

EXCEPTIONS: list[errors.SchedulerError | backend_errors.BackendError] = [
    errors.InvalidRequest("x"),
    errors.InvalidField("logprobs", "unsupported"),
    errors.MalformedRequest("x"),
    errors.UnsupportedContentType("x"),
    errors.PromptTooLarge("x", limit=10),
    errors.ModelNotFound("x"),
    errors.Unauthenticated("x"),
    errors.PermissionDenied("x"),
    errors.AlreadyExists("x"),
    errors.QueueFull("x", retry_after_seconds=2.2),
    errors.QueueBytesFull("x", retry_after_seconds=0.25),
    errors.QueueTimeout("x"),
    errors.ShuttingDown("x"),
    errors.InternalError("x"),
    errors.ReadTimeout("x"),
    errors.ReadCapacityFull("x"),
    errors.DeadlineExceeded("x"),
    errors.BackendNotFound("x"),
    errors.ConfigInvalid("x"),
    errors.ConfigNeedsRestart("x"),
    backend_errors.BackendError("x"),
    backend_errors.BackendUnavailable("x"),
    backend_errors.BackendOverloaded("x"),
    backend_errors.BackendRejectedRequest("x"),
    backend_errors.BackendProtocolError("x"),
]


def test_every_reason_of_the_table_is_exercised() -> None:
    assert {exc.reason for exc in EXCEPTIONS} == set(ERRORS)


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda exc: type(exc).__name__)
def test_errors_take_status_code_and_retry_from_the_table(
    exc: errors.SchedulerError | backend_errors.BackendError,
) -> None:
    reply = error_reply(exc)
    spec = ERRORS[exc.reason]
    assert reply.status == spec.http_status
    assert reply.headers["x-should-retry"] == ("true" if spec.retryable else "false")
    assert reply.body["error"]["code"] == exc.reason.lower()
    assert reply.body["error"]["message"] == str(exc)


def test_queue_caps_carry_retry_after_in_whole_seconds_and_milliseconds() -> None:
    long = error_reply(errors.QueueFull("x", retry_after_seconds=2.2)).headers
    assert (long["retry-after"], long["retry-after-ms"]) == ("3", "2200")
    short = error_reply(errors.QueueBytesFull("x", retry_after_seconds=0.25)).headers
    assert (short["retry-after"], short["retry-after-ms"]) == ("1", "250")
    assert "retry-after" not in error_reply(backend_errors.BackendOverloaded("x")).headers  # no hint to give


def test_types_params_and_unknown_exceptions() -> None:
    assert error_reply(errors.InvalidField("messages[0].name", "no")).body["error"]["param"] == "messages[0].name"
    assert error_reply(errors.Unauthenticated("x")).body["error"]["type"] == "authentication_error"
    assert error_reply(errors.PermissionDenied("x")).body["error"]["type"] == "permission_error"
    assert error_reply(errors.QueueFull("x", retry_after_seconds=1)).body["error"]["type"] == "rate_limit_error"
    bug = error_reply(KeyError("secret detail"))
    assert bug.status == 500 and "secret" not in bug.body["error"]["message"]


def test_deadline_headers() -> None:
    assert timeout_seconds({"x-request-timeout-ms": "1500"}) == 1.5
    assert timeout_seconds({"x-stainless-timeout": "30"}) == 30.0
    assert timeout_seconds({"x-stainless-read-timeout": "600.0", "x-request-timeout-ms": "100"}) == 0.1
    assert timeout_seconds({"x-stainless-timeout": "soon"}) is None  # the SDK's header: ignored when odd
    assert timeout_seconds({}) is None
    assert timeout_seconds({"x-request-timeout-ms": "250.5"}) == 0.2505  # a fraction of a millisecond is kept
    assert timeout_seconds({"x-request-timeout-ms": "0100"}) == 0.1
    assert timeout_seconds({"x-request-timeout-ms": "9" * 400}) == MAX_TIMEOUT_SECONDS  # past any float: the cap


# What Python's float takes besides decimal digits, and what a header value of milliseconds is not. (The
# HTTP parser strips the spaces around a header's value before the door reads it.)
NOT_MILLISECONDS = ["0", "0.0", "-5", "+5", "-0", "nan", "NaN", "inf", "-Infinity", "soon", "", "1_000", " 1e3 "]
NOT_MILLISECONDS += ["1e3", "1E3", "0x10", "100.", ".5", "1 000", "100ms", "100\n", "\u0661\u0660\u0660", "\uff11"]


@pytest.mark.parametrize("bad", NOT_MILLISECONDS)
def test_a_deadline_header_that_is_not_decimal_milliseconds_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(errors.InvalidField) as refused:
        timeout_seconds({"x-request-timeout-ms": bad})
    assert refused.value.param == "x-request-timeout-ms"
    with pytest.raises(errors.InvalidField):
        call_timeout_seconds({"x-request-timeout-ms": bad})


def test_a_peer_certificate_reads_like_grpc_auth_context() -> None:
    certificate = {
        "subject": ((("commonName", "cn-name"),),),
        "subjectAltName": (("email", "a@b.c"), ("DNS", "svc.example"), ("URI", "spiffe://x/y")),
    }
    info = peer_info(certificate)
    assert list(info["peer_dns"]) == [b"svc.example"] and list(info["peer_uri"]) == [b"spiffe://x/y"]
    assert list(info["x509_subject_alternative_name"]) == [b"a@b.c", b"svc.example", b"spiffe://x/y"]
    assert list(info["x509_common_name"]) == [b"cn-name"]


def test_penalties_reach_the_engine_bodies() -> None:
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=-1.0)
    _, body = openai_body(GenerationRequest("r", prompt="p", params=params), "model")
    assert (body["presence_penalty"], body["frequency_penalty"]) == (0.5, -1.0)
    parameters = tgi_body(GenerationRequest("r", prompt="p", params=params))["parameters"]
    assert parameters["frequency_penalty"] == -1.0 and "presence_penalty" not in parameters  # TGI has none
    _, plain = openai_body(GenerationRequest("r", prompt="p"), "model")
    assert "presence_penalty" not in plain and "frequency_penalty" not in plain


def test_both_doors_hand_admission_the_same_neutral_request() -> None:
    """The HTTP door's JSON and the gRPC face's message become one `ClientRequest`: no protobuf in between."""
    body = {
        "model": "m",
        "messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_completion_tokens": 12,
        "temperature": 0.5,
        "stop": "END",
        "seed": 7,
        "prompt_cache_key": "s-1",
    }
    from_http = parse_call(body, "chat").request
    params = pb.GenerationParams(
        model="m",
        messages=[pb.ChatMessage(role="system", content="be brief"), pb.ChatMessage(role="user", content="hi")],
        max_tokens=12,
        temperature=0.5,
        stop=["END"],
        seed=7,
        prompt_cache_key="s-1",
    )
    from_grpc = client_request(params)
    assert from_http == from_grpc
    assert from_grpc.top_p is None and from_grpc.presence_penalty is None  # unset stays unset, not 0
    assert client_request(pb.GenerationParams(model="m", prompt="x")).max_tokens is None


def test_a_lone_surrogate_in_the_json_is_a_malformed_request() -> None:
    with pytest.raises(errors.MalformedRequest, match="not valid Unicode"):
        parse_call({"model": "m", "prompt": "a\ud800b"}, "completion")

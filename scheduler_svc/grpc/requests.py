"""The gRPC face's edge: a `GenerationParams` message (and the call's trace context and end user, from its
metadata) becomes the `ClientRequest` admission takes from either door (the HTTP door builds the same from its
JSON body and headers)."""

from __future__ import annotations

from collections.abc import Iterable

from backends.base import ChatMessage, TraceContext
from llmsched.v1 import scheduler_pb2 as pb
from scheduler_svc.core.admission import END_USER_FIELD, END_USER_HEADER, agreed_end_user
from scheduler_svc.core.errors import InvalidField
from scheduler_svc.core.identity import user_id_problem
from scheduler_svc.core.request import ClientRequest
from scheduler_svc.core.trace_context import TRACEPARENT, TRACESTATE, read_trace_context

Metadata = Iterable[tuple[str, str | bytes]]


def client_request(params: pb.GenerationParams, metadata: Metadata | None = None) -> ClientRequest:
    """The request a gRPC caller sent, as admission takes it from either door: an optional field left unset is
    None; a valid W3C `traceparent` (and `tracestate`) in `metadata` is its trace context; its end user is the
    `end_user` field or `x-end-user-id` (InvalidField when malformed, sent twice, binary or the two differ)."""
    return ClientRequest(
        model=params.model,
        prompt=params.prompt,
        messages=tuple(ChatMessage(m.role, m.content) for m in params.messages),
        max_tokens=params.max_tokens if params.HasField("max_tokens") else None,
        temperature=params.temperature if params.HasField("temperature") else None,
        top_p=params.top_p if params.HasField("top_p") else None,
        stop=tuple(params.stop),
        seed=params.seed if params.HasField("seed") else None,
        ignore_eos=params.ignore_eos,
        presence_penalty=params.presence_penalty if params.HasField("presence_penalty") else None,
        frequency_penalty=params.frequency_penalty if params.HasField("frequency_penalty") else None,
        priority_class=params.priority_class,
        request_id=params.request_id,
        prompt_cache_key=params.prompt_cache_key,
        trace_context=trace_context(metadata) if metadata else None,
        end_user=named_end_user(params.end_user, metadata),
    )


def named_end_user(field: str, metadata: Metadata | None) -> str:
    """The end user the call is for ("" when none): the `end_user` field or `x-end-user-id` metadata, the
    field's form checked first (the Python clients send both: a refusal names the field they were given)."""
    if field and (problem := user_id_problem(field)):
        raise InvalidField(END_USER_FIELD, problem)
    return agreed_end_user(field, end_user(metadata) if metadata else "", field=END_USER_FIELD, carrier="metadata")


def end_user(metadata: Metadata) -> str:
    """The end user the caller names in `x-end-user-id` ("" when none): taken once, never first-wins, as the
    identity metadata is, and of a user id's form."""
    found: str | None = None
    for key, value in metadata:
        if key == END_USER_HEADER:
            if found is not None:
                raise InvalidField(END_USER_HEADER, "metadata sent more than once")
            if not isinstance(value, str):
                raise InvalidField(END_USER_HEADER, "must be text metadata")
            if problem := user_id_problem(value):
                raise InvalidField(END_USER_HEADER, problem)
            found = value
    return found or ""


def trace_context(metadata: Metadata) -> TraceContext | None:
    """The caller's trace context from the call's metadata (gRPC hands keys in lower case); None when it sent
    no `traceparent` (one pass over the metadata, nothing built) or no valid one."""
    parents: list[str] | None = None
    states: list[str] | None = None
    for key, value in metadata:
        if key == TRACEPARENT:
            parents = parents or []
            parents.append(value if isinstance(value, str) else "")
        elif key == TRACESTATE:
            states = states or []
            states.append(value if isinstance(value, str) else "")
    if parents is None:
        return None
    return read_trace_context(parents, states or ())

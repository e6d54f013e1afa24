"""The arguments of a generation call, declared once.

Every client's `submit` and `stream` take the parameters of `generation_call` through `@takes(generation_call)`
and receive the `GenerationCall` it makes of them, so the clients' signatures cannot drift apart, and both
mypy and `help()` show the real parameters.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from llmsched.v1 import scheduler_pb2 as pb

P = ParamSpec("P")
A = TypeVar("A")
S = TypeVar("S")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])

END_USER_HEADER = "x-end-user-id"
TRACEPARENT_HEADER = "traceparent"
TRACESTATE_HEADER = "tracestate"


@dataclass(frozen=True, slots=True)
class GenerationCall:
    """What one generation call asks for: the request's parameters (the end user it is for among them), the
    call's overall deadline, given as `timeout` (seconds from the call) or `deadline` (a `time.monotonic()`
    value), or neither, and the caller's W3C trace context (`trace`: metadata pairs, empty without one)."""

    params: pb.GenerationParams
    timeout: float | None = None
    deadline: float | None = None
    trace: tuple[tuple[str, str], ...] = ()

    def metadata(self, identity: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        """The call's metadata: the connection's identity, the end user named again in `x-end-user-id` (a
        server older than the `end_user` field still serves the call as that end user; a newer one checks the
        two agree), and the trace context; every retry of the call sends the same."""
        end_user = self.params.end_user
        named = ((END_USER_HEADER, end_user),) if end_user else ()
        return (*identity, *named, *self.trace)

    def grpc_timeout(self) -> float | None:
        """The seconds left for a single gRPC call (no retries; past the deadline gRPC fails it at once)."""
        return self.timeout if self.deadline is None else self.deadline - time.monotonic()


def generation_call(
    model: str,
    prompt: str = "",
    *,
    messages: Sequence[tuple[str, str]] = (),
    timeout: float | None = None,
    deadline: float | None = None,
    end_user: str = "",
    traceparent: str = "",
    tracestate: str = "",
    **fields: Any,
) -> GenerationCall:
    """`prompt`, or chat `messages` as (role, text) pairs; `timeout` (seconds) or `deadline` (a
    `time.monotonic()` value): the call's overall deadline; `end_user`: the end user the call is for, inside
    the caller's share (GenerationParams.end_user, and `x-end-user-id`); `traceparent` (and `tracestate`):
    the caller's W3C trace context, which the scheduler continues into the engine (sent as metadata; the
    server ignores one that is not valid, and `tracestate` without a `traceparent`); `fields`: any other
    GenerationParams field by name (max_tokens, priority_class, request_id, ...)."""
    if tracestate and not traceparent:
        raise ValueError("tracestate goes with a traceparent")
    params = pb.GenerationParams(
        model=model,
        prompt=prompt,
        messages=[pb.ChatMessage(role=r, content=c) for r, c in messages],
        end_user=end_user,
        **fields,
    )
    trace: tuple[tuple[str, str], ...] = ((TRACEPARENT_HEADER, traceparent),) if traceparent else ()
    if tracestate:
        trace += ((TRACESTATE_HEADER, tracestate),)
    return GenerationCall(params, timeout, deadline, trace)


def takes(arguments: Callable[P, A]) -> Callable[[Callable[[S, A], R]], Callable[Concatenate[S, P], R]]:
    """Give a method the parameters of `arguments`; it receives what `arguments` returns for them. A coroutine
    method stays one; its docstring goes on with `arguments`' (which documents the parameters)."""

    def decorate(method: Callable[[S, A], R]) -> Callable[Concatenate[S, P], R]:
        def call(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
            return method(self, arguments(*args, **kwargs))

        async def call_async(self: S, /, *args: P.args, **kwargs: P.kwargs) -> object:
            return await cast(Awaitable[object], method(self, arguments(*args, **kwargs)))

        wrapper = cast(Callable[Concatenate[S, P], R], call_async if inspect.iscoroutinefunction(method) else call)
        like(wrapper, method, parameters_of=arguments, returns=inspect.signature(method).return_annotation)
        wrapper.__doc__ = "\n\n".join(inspect.cleandoc(doc) for doc in (method.__doc__, arguments.__doc__) if doc)
        return wrapper

    return decorate


def like(
    wrapper: F,
    original: Callable[..., Any],
    *,
    parameters_of: Callable[..., Any],
    returns: object,
    owner: str | None = None,
) -> F:
    """`wrapper` named and documented as `original` (a method of `owner` when given), with the parameters of
    `parameters_of` (after a positional `self` when they have none) and `returns` as its return annotation, for
    `help()` and `inspect`."""
    parameters = list(inspect.signature(parameters_of).parameters.values())
    if not parameters or parameters[0].name != "self":
        parameters.insert(0, inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY))
    wrapper.__name__ = original.__name__
    if owner is None:
        wrapper.__module__ = original.__module__
    wrapper.__qualname__ = f"{owner}.{original.__name__}" if owner else original.__qualname__
    wrapper.__doc__ = original.__doc__
    wrapper.__signature__ = inspect.Signature(parameters, return_annotation=returns)  # type: ignore[attr-defined]
    return wrapper

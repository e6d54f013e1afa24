"""Tracing's port: what the service tells a traced request's trace at each step of its life.

With `[tracing]` configured the assembly gives the scheduler a `RequestTracer` (the OpenTelemetry one is
`scheduler_svc.app.tracing`); each admitted call gets a `RequestTrace`, kept on its ticket, and dispatch
and the request's run call it as the request is admitted, waits, is sent, answered and ends. Without
`[tracing]` there is no tracer: a ticket's `trace` is None, and each step costs one None check and no
object (the caller's trace context, when valid, still reaches the engine: `QueuedRequest.trace_context`).

Times are the scheduler clock's (`Clock.now()`); the implementation places them on its own time line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from backends.base import TraceContext
from scheduler_svc.core.request import QueuedRequest


@dataclass(frozen=True, slots=True)
class GateChange:
    """A backend's gate for a priority class changed: closed by `cause` (a `policies.GateCause` value), or
    `open` again, at `at`."""

    at: float
    backend: str
    priority_class: str
    cause: str


class GateLog(Protocol):
    """What a model's gates did lately, as far as one priority class's requests are held by them (its own
    class's gates, and those of the better classes it waits behind), for a queue wait to read."""

    def mark(self) -> int:
        """Where the log stands now: `since(mark)` later gives what changed after this moment."""
        ...

    def closed(self) -> Sequence[GateChange]:
        """The gates closed now, each with the change that closed it."""
        ...

    def since(self, mark: int) -> tuple[Sequence[GateChange], int]:
        """The changes after `mark`, oldest first, and how many more there were that the log no longer
        holds (it keeps the latest few)."""
        ...


class RequestTrace(Protocol):
    """One admitted call's trace: its spans, and the context its engine requests carry."""

    def admitted(self, request: QueuedRequest) -> None:
        """Admission passed: the request is queued (and, in a cluster, confirmed)."""
        ...

    def refused(self, error: BaseException) -> None:
        """Admission refused the call (or failed): the trace ends with the error."""
        ...

    def queued(self, at: float, gates: GateLog | None) -> None:
        """The request waits in its queue from `at` (at admission, and again after a failover); `gates`:
        the gates that may hold it (None: another replica decides, and the wait shows no gates)."""
        ...

    def dispatched(
        self, at: float, backend: str, attempt: int, engine_priority: int | None, gates: GateLog | None
    ) -> None:
        """The wait ended at `at`: the request goes to `backend` (its `attempt`-th dispatch)."""
        ...

    def engine_context(self) -> TraceContext | None:
        """The trace context the engine request of the current dispatch carries."""
        ...

    def accepted(self, at: float) -> None:
        """The engine took the request (its response started)."""
        ...

    def first_token(self, at: float, sent_at: float | None) -> None:
        """The engine sent the first token (`sent_at`: when the request left for it)."""
        ...

    def error(self, at: float, error: BaseException) -> None:
        """The current dispatch failed with `error` (a failover or the request's end follows)."""
        ...

    def aborted(self, at: float) -> None:
        """The engine request was closed before its end (the caller left, or it was cut)."""
        ...

    def failed_over(self, at: float) -> None:
        """The current dispatch failed before its first token and the request is queued again."""
        ...

    def ended(self, at: float, outcome: str, completion_tokens: int) -> None:
        """The request reached its one outcome (a `ticket.Outcome` value): the trace ends."""
        ...


class RequestTracer(Protocol):
    """Makes each admitted call's trace."""

    def start(self, context: TraceContext | None, operation: str) -> RequestTrace:
        """The trace of a call named `operation` (its door's method or route), continuing the caller's
        `context` when it sent a valid one."""
        ...

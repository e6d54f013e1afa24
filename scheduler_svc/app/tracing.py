"""OpenTelemetry traces of requests (`[tracing]`): the `core.tracing` port on the official SDK, exported
over OTLP. Imported only when `[tracing]` is configured: otherwise the SDK is never loaded.

Each call is one trace (or a part of its caller's, continued from its W3C `traceparent`):

    POST /v1/chat/completions | llmsched.v1.SchedulerService/Stream (SERVER: the call, admission to outcome)
    |- admission                  identify, validate, queue (and a cluster leader's confirmation)
    |- queue_wait                 gate.closed / gate.opened events: which backends' gates held it, why, when
    |- dispatch (CLIENT)          the engine request, whose `traceparent` is this span: vLLM's spans hang here
    |  |- engine.time_to_first_token   from the request leaving for the engine to its first token
    |  '- stream                  from the first token to the end
    '- queue_wait, dispatch ...   again after a failover (the failed dispatch carries its error)

Sampling follows the caller's sampled flag when it sent a trace context, else `sampling_ratio`; a call that
is not sampled still sends the engine a `traceparent` (flagged unsampled), so the engine does not sample it
either. Spans carry the model, class, user id and request ids, never prompt or answer text.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

import structlog
from opentelemetry import trace as otel
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from backends.base import TraceContext
from scheduler_svc.config import TracingConfig
from scheduler_svc.core.clock import Clock
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.core.trace_context import TRACEPARENT, TRACESTATE
from scheduler_svc.core.tracing import GateChange, GateLog

log = structlog.get_logger(__name__)
_PROPAGATOR = TraceContextTextMapPropagator()
_EMPTY = Context()  # a parent with no span: the call's own trace starts a new trace
FLUSH_SECONDS = 5.0  # on shutdown, how long the spans not yet exported get


def otlp_exporter(config: TracingConfig) -> SpanExporter:
    """The OTLP exporter of `config.protocol` (gRPC: TLS unless the endpoint is http://)."""
    headers = dict(config.headers) or None  # None: the exporter reads OTEL_EXPORTER_OTLP_(TRACES_)HEADERS
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=config.endpoint, headers=headers)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=config.endpoint, headers=headers)


class OtelTracer:
    """The service's `core.tracing.RequestTracer`: its own tracer provider (the process-wide one is left
    alone), spans batched to the OTLP exporter on the SDK's thread, or to `processor` when given (tests: the
    SDK's in-memory exporter)."""

    def __init__(self, config: TracingConfig, clock: Clock, processor: SpanProcessor | None = None) -> None:
        self._clock = clock
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name}),
            sampler=ParentBased(TraceIdRatioBased(config.sampling_ratio)),
            shutdown_on_exit=False,  # `close` flushes, bounded, as the service stops
        )
        self._provider.add_span_processor(processor or BatchSpanProcessor(otlp_exporter(config)))
        self.tracer = self._provider.get_tracer("llmsched")

    def start(self, context: TraceContext | None, operation: str) -> OtelRequestTrace:
        return OtelRequestTrace(self, context, operation)

    def now(self) -> float:
        return self._clock.now()

    def offset_ns(self) -> int:
        """What turns the scheduler clock's seconds into the wall clock's nanoseconds (spans' stamps) now."""
        return time.time_ns() - round(self._clock.now() * 1e9)

    def close(self, timeout: float = FLUSH_SECONDS) -> None:
        """Export what is still held (for at most `timeout`) and stop; blocking, so run it off the loop."""
        self._provider.force_flush(int(timeout * 1000))
        self._provider.shutdown()


P = ParamSpec("P")
R = TypeVar("R")
_reported: set[str] = set()  # the steps whose failure was logged (once each)


def _never_raises(step: Callable[P, R]) -> Callable[P, R | None]:
    """A trace step that fails is logged (once per step) and answers None: tracing never fails a request, nor
    a decision pass (dispatch calls these in the middle of its own accounting)."""

    @functools.wraps(step)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R | None:
        try:
            return step(*args, **kwargs)
        except Exception:
            if step.__name__ not in _reported:
                _reported.add(step.__name__)
                log.exception("tracing_step_failed", step=step.__name__)
            return None

    return guarded


def _error_status(error: BaseException) -> Status:
    """The status of a span that ended with `error`: its reason (the error table's, for the service's own)."""
    return Status(StatusCode.ERROR, f"{getattr(error, 'reason', type(error).__name__)}: {error}")


def _error(span: Span, error: BaseException, at: int) -> None:
    span.record_exception(error, timestamp=at)
    span.set_status(_error_status(error))


class OtelRequestTrace:
    """One call's spans (`core.tracing.RequestTrace`); see the module docstring for their shape."""

    def __init__(self, owner: OtelTracer, context: TraceContext | None, operation: str) -> None:
        self._owner = owner
        tracer = owner.tracer
        parent = _EMPTY
        if context is not None:
            parent = _PROPAGATOR.extract({TRACEPARENT: context.traceparent, TRACESTATE: context.tracestate})
        # One offset for the whole trace: its spans' times keep the order of the scheduler clock's.
        self._offset = owner.offset_ns()
        start = self._wall(owner.now())
        self._call = tracer.start_span(
            operation or "llmsched.request", context=parent, kind=SpanKind.SERVER, start_time=start
        )
        self._in_call = otel.set_span_in_context(self._call, _EMPTY)
        self._admission: Span | None = tracer.start_span("admission", context=self._in_call, start_time=start)
        self._wait: Span | None = None
        self._gate_mark = 0
        self._held: set[str] = set()  # the causes of the gates that held the current wait
        self._dispatch: Span | None = None
        self._in_dispatch = _EMPTY
        self._dispatched_at = 0
        self._stream: Span | None = None
        self._done = False

    # -- admission --------------------------------------------------------------------------------------------
    @_never_raises
    def admitted(self, request: QueuedRequest) -> None:
        self._call.set_attributes(
            {
                "llmsched.model": request.model,
                "llmsched.priority_class": request.priority_class,
                "llmsched.user": request.user,
                "llmsched.request_id": request.request_id,
                "llmsched.client_request_id": request.client_request_id,
            }
        )
        if self._admission is not None:
            self._admission.end(self._wall(self._owner.now()))
            self._admission = None

    @_never_raises
    def refused(self, error: BaseException) -> None:
        if self._done:
            return
        now = self._wall(self._owner.now())
        if self._admission is not None:
            _error(self._admission, error, now)
            self._admission.end(now)
            self._admission = None
        self._finish(now, "rejected", 0, error)

    # -- the queue and the engine -----------------------------------------------------------------------------
    @_never_raises
    def queued(self, at: float, gates: GateLog | None) -> None:
        start = self._wall(at)
        self._wait = self._owner.tracer.start_span("queue_wait", context=self._in_call, start_time=start)
        self._held = set()
        if gates is not None:
            self._gate_mark = gates.mark()
            self._gate_events(self._wait, gates.closed(), start)

    @_never_raises
    def dispatched(
        self, at: float, backend: str, attempt: int, engine_priority: int | None, gates: GateLog | None
    ) -> None:
        now = self._wall(at)
        if self._wait is not None:
            if gates is not None:
                changes, lost = gates.since(self._gate_mark)
                self._gate_events(self._wait, changes)
                if lost:
                    self._wait.set_attribute("llmsched.gate.changes_lost", lost)
            self._end_wait(now)
        attributes: dict[str, str | int] = {"llmsched.backend": backend, "llmsched.attempt": attempt}
        if engine_priority is not None:
            attributes["llmsched.engine_priority"] = engine_priority
        self._dispatch = self._owner.tracer.start_span(
            "dispatch", context=self._in_call, kind=SpanKind.CLIENT, start_time=now, attributes=attributes
        )
        self._in_dispatch = otel.set_span_in_context(self._dispatch, _EMPTY)
        self._dispatched_at = now

    @_never_raises
    def engine_context(self) -> TraceContext | None:
        if self._dispatch is None:
            return None
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=self._in_dispatch)
        parent = carrier.get(TRACEPARENT)
        return None if parent is None else TraceContext(parent, carrier.get(TRACESTATE, ""))

    @_never_raises
    def accepted(self, at: float) -> None:
        if self._dispatch is not None:
            self._dispatch.add_event("engine.accepted", timestamp=self._wall(at))

    @_never_raises
    def first_token(self, at: float, sent_at: float | None) -> None:
        if self._dispatch is None:
            return
        now = self._wall(at)
        sent = self._dispatched_at if sent_at is None else self._wall(sent_at)
        tracer = self._owner.tracer
        tracer.start_span("engine.time_to_first_token", context=self._in_dispatch, start_time=sent).end(now)
        self._stream = tracer.start_span("stream", context=self._in_dispatch, start_time=now)

    @_never_raises
    def error(self, at: float, error: BaseException) -> None:
        if self._dispatch is not None:
            _error(self._dispatch, error, self._wall(at))

    @_never_raises
    def aborted(self, at: float) -> None:
        if self._dispatch is not None:
            self._dispatch.add_event("engine.aborted", timestamp=self._wall(at))

    @_never_raises
    def failed_over(self, at: float) -> None:
        if self._dispatch is not None:
            self._dispatch.set_attribute("llmsched.failed_over", True)
            self._dispatch.end(self._wall(at))
            self._dispatch = None
            self._in_dispatch = _EMPTY

    @_never_raises
    def ended(self, at: float, outcome: str, completion_tokens: int) -> None:
        if not self._done:
            self._finish(self._wall(at), outcome, completion_tokens, None)

    # -- helpers ----------------------------------------------------------------------------------------------
    def _wall(self, at: float) -> int:
        """The scheduler clock's `at` on the wall clock, in nanoseconds."""
        return self._offset + round(at * 1e9)

    def _gate_events(self, span: Span, changes: Sequence[GateChange], at: int | None = None) -> None:
        """A `gate.closed` / `gate.opened` event per change (at its own time unless `at` is given)."""
        for change in changes:
            closed = change.cause != "open"
            if closed:
                self._held.add(change.cause)
            span.add_event(
                "gate.closed" if closed else "gate.opened",
                {
                    "llmsched.backend": change.backend,
                    "llmsched.priority_class": change.priority_class,
                    "llmsched.gate.cause": change.cause,
                },
                timestamp=self._wall(change.at) if at is None else at,
            )

    def _end_wait(self, at: int) -> None:
        if self._wait is None:
            return
        if self._held:
            self._wait.set_attribute("llmsched.gate.causes", sorted(self._held))
        self._wait.end(at)
        self._wait = None

    def _finish(self, at: int, outcome: str, completion_tokens: int, error: BaseException | None) -> None:
        """End every open span; the call's with its outcome (an error status unless it completed)."""
        self._done = True
        if self._admission is not None:
            self._admission.end(at)
            self._admission = None
        self._end_wait(at)
        if self._stream is not None:
            self._stream.set_attribute("llmsched.completion_tokens", completion_tokens)
            self._stream.end(at)
            self._stream = None
        if self._dispatch is not None:
            self._dispatch.end(at)
            self._dispatch = None
        call = self._call
        call.set_attributes({"llmsched.outcome": outcome, "llmsched.completion_tokens": completion_tokens})
        if error is not None:
            call.set_status(_error_status(error))
        elif outcome != "completed":
            call.set_status(Status(StatusCode.ERROR, outcome))
        call.end(at)

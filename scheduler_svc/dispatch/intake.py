"""The one admission path of both doors (gRPC Submit/Stream, the HTTP door): identify the caller, validate
its request by the admission rules (`core.admission`), queue it, and have the cluster's leader confirm it;
and the counter of refused admissions. So caps, the rejection counter and error reporting are the same
whichever door a request came through."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from scheduler_svc.core.admission import build_request
from scheduler_svc.core.errors import InternalError, SchedulerError
from scheduler_svc.core.request import ClientRequest
from scheduler_svc.core.text import UNKNOWN_LABEL, client_text
from scheduler_svc.core.ticket import Outcome, Ticket
from scheduler_svc.dispatch.scheduler import Scheduler

log = structlog.get_logger(__name__)


async def admit_call(
    scheduler: Scheduler,
    message: ClientRequest,
    *,
    identify: Callable[[], str],
    timeout: float | None,
    watch_positions: bool = False,
    operation: str = "",
) -> Ticket:
    """Identify the caller (`identify` raises Unauthenticated), validate and queue the request, and have the
    scheduler's guard (a cluster's leader) confirm it (`watch_positions`: the caller streams queue positions);
    a refusal closes the ticket as rejected and raises.
    A bug on the way (anything that is not a SchedulerError) is counted and logged once, and surfaces as
    InternalError. With tracing on, the call's trace (named `operation`, its door's method or route) starts
    here, continuing the caller's trace context."""
    tracer = scheduler.tracer
    trace = None if tracer is None else tracer.start(message.trace_context, operation)
    try:
        request = build_request(
            message, user=identify(), config=scheduler.config, now=scheduler.clock.now(), timeout=timeout
        )
        ticket = scheduler.admit(request, trace=trace)
    except SchedulerError as exc:
        if trace is not None:
            trace.refused(exc)
        raise
    except Exception as exc:
        scheduler.errors.report("admission", exc)
        error = InternalError("the scheduler failed to admit the request")
        if trace is not None:
            trace.refused(error)
        raise error from exc
    ticket.watches_position = watch_positions  # known before the guard: a cluster leader then sends positions
    guard = scheduler.guard
    if guard is not None:
        try:
            await guard.confirm(ticket)
        except SchedulerError as exc:
            if trace is not None:
                trace.refused(exc)
            ticket.close(Outcome.REJECTED)
            raise
        except BaseException:
            ticket.close()  # the caller left while waiting (cancelled), or a bug: the ticket must not linger
            raise
    if trace is not None:
        trace.admitted(ticket.request)
    return ticket


def count_rejection(scheduler: Scheduler, model: str, exc: SchedulerError) -> None:
    """Count and log a refused admission. The label is a configured model name or one fixed value, never the
    client's string: each distinct label value is a series held for the life of the process."""
    label = model if model in scheduler.dispatchers else UNKNOWN_LABEL
    scheduler.metrics.rejected.labels(label, exc.reason.lower()).inc()
    log.info("request_rejected", model=client_text(model), reason=exc.reason, error=str(exc))

"""Build the GetQueueState answer from a dispatcher's live state."""

from __future__ import annotations

import heapq

from google.protobuf import duration_pb2

from llmsched.v1 import scheduler_pb2 as pb
from scheduler_svc.core.errors import InvalidRequest
from scheduler_svc.dispatch.dispatcher import ModelDispatcher

DEFAULT_MAX_USERS = 100
MAX_USERS_CAP = 1000
MAX_USER_FILTER_BYTES = 256


def user_limits(user: str, max_users: int | None) -> int:
    """Check a GetQueueState request's user filter (client input: its length is bounded, and it is never
    echoed) and return the effective per-class user cap (`max_users` None: unset, the default)."""
    if len(user.encode()) > MAX_USER_FILTER_BYTES:
        raise InvalidRequest(f"user filter longer than {MAX_USER_FILTER_BYTES} bytes")
    if max_users is None:
        return DEFAULT_MAX_USERS
    if max_users < 0:
        raise InvalidRequest("max_users must not be negative")
    return min(max_users, MAX_USERS_CAP)


def to_duration(seconds: float | None) -> duration_pb2.Duration | None:
    """A Duration, or None (the field left unset) when the value is unknown (shared by the gRPC face)."""
    if seconds is None:
        return None
    value = duration_pb2.Duration()
    value.FromNanoseconds(int(max(seconds, 0.0) * 1e9))
    return value


def queue_state(dispatcher: ModelDispatcher, user: str = "", max_users: int = DEFAULT_MAX_USERS) -> pb.ModelQueueState:
    """A snapshot of one model: bands with per-user depth and fair-share counters (only `user` when set;
    at most `max_users` per band, most queued first), and gate states."""
    now = dispatcher.clock.now()
    classes = []
    for band in dispatcher.queues.bands:
        counters = dispatcher.fairness[band.priority_class.name].counters()
        names = ({user} & (band.flows.keys() | counters.keys())) if user else band.flows.keys() | counters.keys()

        depths = {name: len(band.flows[name]) if name in band.flows else 0 for name in names}
        shown = heapq.nsmallest(max_users, depths, key=lambda name: (-depths[name], name))  # O(n log max_users)
        classes.append(
            pb.ClassQueueState(
                priority_class=band.priority_class.name,
                rank=band.priority_class.rank,
                queued=band.size,
                users=[
                    pb.UserQueueState(user=name, queued=depths[name], fair_share_counter=counters.get(name))
                    for name in shown
                ],
                users_total=len(names),
                truncated=len(shown) < len(names),
            )
        )
    gates = []
    for state in dispatcher.backend_states():
        reading = state.inputs.reading
        age = state.inputs.reading_age()
        gates.append(
            pb.GateState(
                backend=state.name,
                priority_class=state.priority_class,
                open=state.decision.open,
                reason=state.decision.reason,
                metrics_fresh=state.decision.fresh,
                reading_age=to_duration(age),
                engine_waiting=reading.waiting if reading else None,
                engine_running=reading.running if reading else None,
                engine_tpot=to_duration(reading.tpot_seconds if reading else None),
                engine_kv_cache_usage=reading.kv_cache_usage if reading else None,
                in_flight=state.inputs.in_flight,
                sent_unseen=state.inputs.sent_unseen,
                estimated_waiting=state.inputs.estimated_waiting(),
            )
        )
    return pb.ModelQueueState(
        model=dispatcher.model.name,
        queued=len(dispatcher.queues),
        running=dispatcher.busy - len(dispatcher.queues),
        drain_rate_per_second=dispatcher.drain.rate(now),
        classes=classes,
        gates=gates,
    )

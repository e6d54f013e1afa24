"""The GetQueueState answer, from a model's dispatch snapshot (`dispatch.introspection`), the bounds on what
a caller may ask of it, and a backend's drain state as the admin calls answer it."""

from __future__ import annotations

from google.protobuf import duration_pb2

from llmsched.v1 import scheduler_pb2 as pb
from scheduler_svc.core.errors import InvalidRequest
from scheduler_svc.dispatch.backend_handle import Drain
from scheduler_svc.dispatch.introspection import BackendStatus, ModelSnapshot

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


_DRAIN_SOURCES = {
    Drain.ADMIN: pb.DRAIN_SOURCE_ADMIN,
    Drain.CONFIG: pb.DRAIN_SOURCE_CONFIG,
    Drain.REMOVED: pb.DRAIN_SOURCE_REMOVED,
}


def backend_state(model: str, status: BackendStatus) -> pb.BackendQueueState:
    """A backend as GetQueueState and the drain calls show it."""
    return pb.BackendQueueState(
        model=model,
        backend=status.name,
        draining=bool(status.drains),
        drained_by=[_DRAIN_SOURCES[drain] for drain in status.drains],
        in_flight=status.in_flight,
    )


def queue_state(snapshot: ModelSnapshot) -> pb.ModelQueueState:
    """GetQueueState's answer for one model, from its dispatch's snapshot."""
    classes = [
        pb.ClassQueueState(
            priority_class=cls.priority_class,
            rank=cls.rank,
            queued=cls.queued,
            users=[
                pb.UserQueueState(
                    user=u.user, queued=u.queued, fair_share_counter=u.fair_share_counter, end_users=u.end_users
                )
                for u in cls.users
            ],
            users_total=cls.users_total,
            truncated=cls.truncated,
            removed=cls.removed,
        )
        for cls in snapshot.classes
    ]
    gates = []
    for state in snapshot.gates:
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
        model=snapshot.model,
        queued=snapshot.queued,
        running=snapshot.running,
        drain_rate_per_second=snapshot.drain_rate_per_second,
        classes=classes,
        gates=gates,
        backends=[backend_state(snapshot.model, status) for status in snapshot.backends],
        removed=snapshot.removed,
    )

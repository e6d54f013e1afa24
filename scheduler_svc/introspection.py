"""Build the GetQueueState answer from a dispatcher's live state."""

from __future__ import annotations

from scheduler_svc._proto.llmsched.v1 import scheduler_pb2 as pb
from scheduler_svc.dispatcher import ModelDispatcher


def queue_state(dispatcher: ModelDispatcher) -> pb.ModelQueueState:
    """A snapshot of one model: bands with per-user depth and fair-share counters, and gate states."""
    now = dispatcher.clock.now()
    classes = []
    for band in dispatcher.queues.bands:
        counters = dispatcher.fairness[band.priority_class.name].counters()
        users = sorted(set(band.flows) | set(counters))
        classes.append(
            pb.ClassQueueState(
                priority_class=band.priority_class.name,
                rank=band.priority_class.rank,
                queued=band.size,
                users=[
                    pb.UserQueueState(
                        user=user,
                        queued=len(band.flows[user]) if user in band.flows else 0,
                        fair_share_counter=counters.get(user, 0.0),
                    )
                    for user in users
                ],
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
                reading_age_seconds=age if age is not None else -1.0,
                engine_waiting=reading.waiting if reading else 0,
                engine_running=reading.running if reading else 0,
                engine_tpot_seconds=reading.tpot_seconds if reading and reading.tpot_seconds is not None else -1.0,
                engine_kv_cache_usage=(
                    reading.kv_cache_usage if reading and reading.kv_cache_usage is not None else -1.0
                ),
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

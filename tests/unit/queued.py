"""Queueing a test request in a band as the dispatcher does: pushed into its user's flow, and the band's
fairness account told when the user becomes backlogged (the drivers of the fairness tests share it)."""

from __future__ import annotations

from backends.base import SamplingParams
from scheduler_svc.core.queues import ModelQueues
from scheduler_svc.core.request import QueuedRequest
from scheduler_svc.policies import Fairness

CLASS = "interactive"


def queue_request(
    queues: ModelQueues,
    policy: Fairness,
    request_id: str,
    user: str,
    *,
    prompt: str,
    max_tokens: int,
    admitted_at: float,
) -> QueuedRequest:
    """Queue a request of model "m" in the `interactive` band of `queues`."""
    request = QueuedRequest(
        request_id, "m", user, CLASS, prompt, None, SamplingParams(max_tokens=max_tokens), admitted_at
    )
    _, newly = queues.push(request)
    if newly:
        policy.account.on_backlogged(user, queues.band(CLASS).flow_views)
    return request

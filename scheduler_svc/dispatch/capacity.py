"""Capacity and load shedding: the caps a model's queue holds to, and the retry hint a refusal carries.

A request is refused before it is queued when the model or its user would hold more requests or more
prompt bytes than configured. The hint tells the client when to come back: the time the scheduler needs
to dispatch a tenth of the backlog that is in its way, at the rate it has been dispatching lately.
"""

from __future__ import annotations

from typing import Protocol

from scheduler_svc.config import ModelConfig
from scheduler_svc.core.errors import QueueBytesFull, QueueFull
from scheduler_svc.core.request import QueuedRequest

MIN_RETRY_SECONDS = 0.1
MAX_RETRY_SECONDS = 300.0
UNKNOWN_RATE_RETRY_SECONDS = 1.0


def retry_after(backlog: int, rate: float) -> float:
    """Time for the scheduler to dispatch a tenth of `backlog` (at least one request) at `rate`/s."""
    if rate <= 0:
        return UNKNOWN_RATE_RETRY_SECONDS
    return min(MAX_RETRY_SECONDS, max(MIN_RETRY_SECONDS, max(1.0, backlog / 10) / rate))


class QueuedCounts(Protocol):
    """What the caps read of a model's queue (`queue_book.QueueBook` and `core.queues.ModelQueues` are ones)."""

    def __len__(self) -> int: ...

    def user_depth(self, user: str) -> int:
        """Requests the user has queued, all classes together."""
        ...

    def users_in(self, priority_class: str) -> int:
        """Users with requests queued in the class."""
        ...


class Capacity:
    """One model's caps (`max_queued*` and `max_queued_bytes*`) and the prompt bytes its requests hold.

    Bytes are held from admission to the outcome (queued and running alike), so a flood of huge prompts is
    bounded by memory, not by count; request counts are capped on the queue alone.
    """

    def __init__(self, model: ModelConfig, queues: QueuedCounts) -> None:
        self._model = model
        self._queues = queues
        self.held_bytes = 0  # prompt bytes of queued and running requests
        self._user_bytes: dict[str, int] = {}

    def check(self, request: QueuedRequest, busy: int, rate: float) -> None:
        """Raise QueueBytesFull or QueueFull (with a retry hint) when queueing `request` would pass a cap.
        `busy`: requests queued or running; `rate`: recent dispatches per second (0: unknown)."""
        model, queues = self._model, self._queues
        if self.held_bytes + request.prompt_bytes > model.max_queued_bytes:
            raise QueueBytesFull(
                f"model {model.name} holds {self.held_bytes} prompt bytes in queued and running requests "
                f"(capacity {model.max_queued_bytes}, max_queued_bytes)",
                retry_after_seconds=retry_after(busy, rate),
            )
        user_bytes = self._user_bytes.get(request.user, 0)
        if user_bytes + request.prompt_bytes > model.max_queued_bytes_per_user:
            user_rate = rate / max(1, queues.users_in(request.priority_class))
            raise QueueBytesFull(
                f"user {request.user} holds {user_bytes} prompt bytes in queued and running requests for "
                f"{model.name} (limit {model.max_queued_bytes_per_user}, max_queued_bytes_per_user)",
                retry_after_seconds=retry_after(max(1, queues.user_depth(request.user)), user_rate),
            )
        if len(queues) >= model.max_queued:
            raise QueueFull(
                f"model {model.name} has {len(queues)} requests queued (capacity {model.max_queued})",
                retry_after_seconds=retry_after(len(queues), rate),
            )
        depth = queues.user_depth(request.user)
        if depth >= model.max_queued_per_user:
            user_rate = rate / max(
                1, queues.users_in(request.priority_class)
            )  # fairness: each backlogged user this much
            raise QueueFull(
                f"user {request.user} has {depth} requests queued for {model.name} (limit {model.max_queued_per_user})",
                retry_after_seconds=retry_after(depth, user_rate),
            )

    def hold(self, request: QueuedRequest) -> None:
        """An admitted request holds its prompt bytes until its outcome."""
        self.held_bytes += request.prompt_bytes
        self._user_bytes[request.user] = self._user_bytes.get(request.user, 0) + request.prompt_bytes

    def release(self, request: QueuedRequest) -> None:
        """The request reached its outcome: its bytes are free again."""
        self.held_bytes -= request.prompt_bytes
        left = self._user_bytes.get(request.user, 0) - request.prompt_bytes
        if left > 0:
            self._user_bytes[request.user] = left
        else:
            self._user_bytes.pop(request.user, None)

    def user_bytes(self, user: str) -> int:
        """Prompt bytes `user`'s queued and running requests hold."""
        return self._user_bytes.get(user, 0)

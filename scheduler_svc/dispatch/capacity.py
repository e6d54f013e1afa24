"""Capacity and load shedding: the caps a model's queue holds to, and the retry hint a refusal carries.

A request is refused before it is queued when the model or its user would hold more requests or more
prompt bytes than configured, or its user would hold requests for more end users than configured. The
hint tells the client when to come back: the time until a tenth of the backlog in its way can have left
the queue, which is the later of two estimates (`dispatch_eta`): at the rate the scheduler has been
dispatching lately, and, while no engine can take more, as running requests end (their remaining tokens
at their engine's time per output token) and make room. Never less than the
model's `min_retry_after_seconds`: a refusal while every slot is held by long answers says so, instead of
inviting the client's retries within the second.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from scheduler_svc.config import ModelConfig
from scheduler_svc.core.errors import QueueBytesFull, QueueFull
from scheduler_svc.core.request import QueuedRequest

MAX_RETRY_SECONDS = 300.0
UNKNOWN_RETRY_SECONDS = 1.0  # nothing to estimate from (no dispatch yet, no running request)

DispatchEta = Callable[[int, str], "float | None"]
"""(dispatches needed, priority class) -> seconds until that many requests can have left the queue, or None."""


def dispatch_eta(needed: int, rate: float, frees: Sequence[float] | None) -> float | None:
    """Seconds until `needed` more requests can have been dispatched: at the recent dispatch `rate` (per
    second; 0: unknown), and when no engine can take more now (`frees` given), not before running requests
    end to make room (`frees`: each one's expected seconds left, ascending; beyond them, each further wave
    takes about as long as the longest). The later of the two; None when neither is known."""
    estimates = []
    if rate > 0:
        estimates.append(needed / rate)
    if frees:
        waves = needed / len(frees)
        estimates.append(frees[needed - 1] if needed <= len(frees) else frees[-1] * waves)
    return max(estimates) if estimates else None


def retry_hint(eta: float | None, floor: float) -> float:
    """The retry delay a refusal suggests: the estimate, within [floor, MAX_RETRY_SECONDS]."""
    return min(MAX_RETRY_SECONDS, max(floor, UNKNOWN_RETRY_SECONDS if eta is None else eta))


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
    """One model's caps (`max_queued*`, `max_queued_bytes*`, `max_end_users_per_user`) and the prompt bytes
    and end users its requests hold.

    Bytes are held from admission to the outcome (queued and running alike), so a flood of huge prompts is
    bounded by memory, not by count; request counts are capped on the queue alone; a user's end users are
    counted from admission to the outcome, so the end users whose state a user makes the service keep are
    bounded at every moment.
    """

    def __init__(self, model: ModelConfig, queues: QueuedCounts) -> None:
        self._model = model
        self._queues = queues
        self.held_bytes = 0  # prompt bytes of queued and running requests
        self._user_bytes: dict[str, int] = {}
        self._end_users: dict[str, dict[str, int]] = {}  # user -> end user -> its queued and running requests

    def use(self, model: ModelConfig) -> None:
        """The model's caps from a reloaded configuration: they hold for the next admission (what is queued
        stays queued, also above a lowered cap)."""
        self._model = model

    def check(self, request: QueuedRequest, busy: int, eta: DispatchEta) -> None:
        """Raise QueueBytesFull or QueueFull (with a retry hint) when queueing `request` would pass a cap.
        `busy`: requests queued or running; `eta`: the dispatcher's estimate of when so many requests can
        have left the queue."""
        model, queues = self._model, self._queues
        cls = request.priority_class

        def hint(backlog: int, share: int = 1) -> float:
            """A tenth of `backlog` (at least one) dispatched, of which the user gets one in `share`."""
            return retry_hint(eta(max(1, backlog // 10) * share, cls), model.min_retry_after_seconds)

        users = max(1, queues.users_in(cls))  # fairness serves each backlogged user in turn
        if self.held_bytes + request.prompt_bytes > model.max_queued_bytes:
            raise QueueBytesFull(
                f"model {model.name} holds {self.held_bytes} prompt bytes in queued and running requests "
                f"(capacity {model.max_queued_bytes}, max_queued_bytes)",
                retry_after_seconds=hint(busy),
            )
        user_bytes = self._user_bytes.get(request.user, 0)
        if user_bytes + request.prompt_bytes > model.max_queued_bytes_per_user:
            raise QueueBytesFull(
                f"user {request.user} holds {user_bytes} prompt bytes in queued and running requests for "
                f"{model.name} (limit {model.max_queued_bytes_per_user}, max_queued_bytes_per_user)",
                retry_after_seconds=hint(queues.user_depth(request.user), users),
            )
        if len(queues) >= model.max_queued:
            raise QueueFull(
                f"model {model.name} has {len(queues)} requests queued (capacity {model.max_queued})",
                retry_after_seconds=hint(len(queues)),
            )
        depth = queues.user_depth(request.user)
        if depth >= model.max_queued_per_user:
            raise QueueFull(
                f"user {request.user} has {depth} requests queued for {model.name} (limit {model.max_queued_per_user})",
                retry_after_seconds=hint(depth, users),
            )
        end_users = self._end_users.get(request.user, {})
        if request.end_user and request.end_user not in end_users and len(end_users) >= model.max_end_users_per_user:
            raise QueueFull(
                f"user {request.user} has requests of {len(end_users)} end users queued or running for "
                f"{model.name} (limit {model.max_end_users_per_user}, max_end_users_per_user)",
                retry_after_seconds=hint(max(1, queues.user_depth(request.user)), users),
            )

    def hold(self, request: QueuedRequest) -> None:
        """An admitted request holds its prompt bytes until its outcome."""
        self.held_bytes += request.prompt_bytes
        self._user_bytes[request.user] = self._user_bytes.get(request.user, 0) + request.prompt_bytes
        if request.end_user:
            held = self._end_users.setdefault(request.user, {})
            held[request.end_user] = held.get(request.end_user, 0) + 1

    def release(self, request: QueuedRequest) -> None:
        """The request reached its outcome: its bytes are free again."""
        self.held_bytes -= request.prompt_bytes
        left = self._user_bytes.get(request.user, 0) - request.prompt_bytes
        if left > 0:
            self._user_bytes[request.user] = left
        else:
            self._user_bytes.pop(request.user, None)
        if request.end_user:
            held = self._end_users[request.user]
            if held[request.end_user] > 1:
                held[request.end_user] -= 1
            elif len(held) > 1:
                del held[request.end_user]
            else:
                del self._end_users[request.user]

    def user_bytes(self, user: str) -> int:
        """Prompt bytes `user`'s queued and running requests hold."""
        return self._user_bytes.get(user, 0)

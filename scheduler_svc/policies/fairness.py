"""Fairness policies: which user's flow of a band is served next.

A policy instance serves one band of one model and keeps its own state. The dispatcher tells it when a
flow becomes backlogged, when one of its requests is dispatched and when tokens are generated, so
token-cost policies work without the dispatcher knowing which policy it runs.

    round_robin            one request per backlogged user in turn; ignores weights
    weighted_round_robin   request counts in proportion to weights (stride scheduling)
    vtc                    Virtual Token Counter with length prediction: token shares by weight
    vtc_basic              Virtual Token Counter as published (counters only; converges more slowly)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Protocol

from scheduler_svc.config import SchedulingConfig
from scheduler_svc.policies.registry import Registry
from scheduler_svc.policies.weights import WeightResolver
from scheduler_svc.queues import FlowView
from scheduler_svc.request import RequestView


class FairnessPolicy(Protocol):
    """Chooses between the backlogged users of one band."""

    def on_backlogged(self, user: str, flows: Mapping[str, FlowView]) -> None:
        """`user`'s flow went from empty to non-empty; `flows` are all backlogged flows, it included."""
        ...

    def select(self, flows: Mapping[str, FlowView]) -> str:
        """The user whose flow is served next; `flows` is non-empty."""
        ...

    def on_dispatched(self, request: RequestView) -> None:
        """`request` left the queue for an engine."""
        ...

    def on_generated(self, request: RequestView, tokens: int) -> None:
        """`tokens` more tokens were generated for `request` (dispatched from this band)."""
        ...

    def on_finished(self, request: RequestView, generated: int) -> None:
        """`request` ended (any outcome) after generating `generated` tokens."""
        ...

    def on_requeued(self, request: RequestView) -> None:
        """`request` came back before its first token (failover) and is queued again: undo what
        `on_dispatched` charged, since the engine did no work for it; it will be dispatched again."""
        ...

    def counters(self) -> dict[str, float]:
        """Per-user fair-share state for introspection (empty when the policy keeps none)."""
        ...


class _ServiceHooks:
    """Default no-op reactions to service events, for policies that do not charge for some of them."""

    def on_dispatched(self, request: RequestView) -> None:
        return None

    def on_generated(self, request: RequestView, tokens: int) -> None:
        return None

    def on_finished(self, request: RequestView, generated: int) -> None:
        return None

    def on_requeued(self, request: RequestView) -> None:
        return None


class RoundRobinFairness(_ServiceHooks):
    """Serve backlogged users in turn, one request each: fair by request count.

    Trade-off: cheap and predictable, but a user asking for 1000-token answers gets 20x the engine time of
    one asking for 50-token answers, and weights are ignored. A user who becomes backlogged joins the end
    of the ring, so behind a flood they wait for at most one more of each other backlogged user's requests.
    """

    def __init__(self, weights: WeightResolver | None = None, settings: SchedulingConfig | None = None) -> None:
        self._ring: deque[str] = deque()
        self._in_ring: set[str] = set()

    def on_backlogged(self, user: str, flows: Mapping[str, FlowView]) -> None:
        if user not in self._in_ring:
            self._ring.append(user)
            self._in_ring.add(user)

    def select(self, flows: Mapping[str, FlowView]) -> str:
        while self._ring:
            user = self._ring.popleft()
            if user in flows:
                self._ring.append(user)
                return user
            self._in_ring.discard(user)  # went idle: forget it; it rejoins at the end when it returns
        raise LookupError("select() called with backlogged flows that were never announced")

    def on_requeued(self, request: RequestView) -> None:
        """The user's turn was spent on a request the engine failed: give the turn back."""
        if request.user in self._in_ring:
            self._ring.remove(request.user)
        else:
            self._in_ring.add(request.user)
        self._ring.appendleft(request.user)

    def counters(self) -> dict[str, float]:
        return {}


class _VirtualCounterFairness(_ServiceHooks):
    """Serve the backlogged user with the least weighted service so far, in two levels: first the group
    with the smallest counter, then its user with the smallest counter. Subclasses decide what service
    costs (per request, or per token as tokens stream) and may add work already committed to the engine.

    A flow that becomes backlogged has its counter lifted to the smallest counter among the backlogged
    (its group's likewise), so idle time earns no credit and a returning user cannot monopolise the
    engine; it does not go down, so briefly going idle does not wipe out what a user consumed. Ties go to
    the flow that has been backlogged longest (the order of `flows`).
    """

    def __init__(self, weights: WeightResolver | None = None, settings: SchedulingConfig | None = None) -> None:
        self._weights = weights or WeightResolver()
        self._user_counter: dict[str, float] = {}
        self._group_counter: dict[str, float] = {}

    def on_backlogged(self, user: str, flows: Mapping[str, FlowView]) -> None:
        group = self._weights.group_of(user)
        others = [u for u in flows if u != user]
        peers = [u for u in others if self._weights.group_of(u) == group]
        if peers:  # users are compared only within their group
            floor = min(self._user_counter.get(u, 0.0) for u in peers)
            self._user_counter[user] = max(self._user_counter.get(user, 0.0), floor)
            return
        groups = {self._weights.group_of(u) for u in others}  # the group just became backlogged
        floor = min((self._group_counter.get(g, 0.0) for g in groups), default=0.0)
        self._group_counter[group] = max(self._group_counter.get(group, 0.0), floor)

    def _user_key(self, user: str) -> float:
        return self._user_counter.get(user, 0.0)

    def _group_key(self, group: str) -> float:
        return self._group_counter.get(group, 0.0)

    def select(self, flows: Mapping[str, FlowView]) -> str:
        best_group: tuple[float, str] | None = None
        best_user: dict[str, tuple[float, str]] = {}
        for user in flows:  # dict order: longest backlogged first, so strict < keeps the older on ties
            group = self._weights.group_of(user)
            key = self._user_key(user)
            if group not in best_user or key < best_user[group][0]:
                best_user[group] = (key, user)
            group_key = self._group_key(group)
            if best_group is None or group_key < best_group[0]:
                best_group = (group_key, group)
        assert best_group is not None, "select() needs at least one backlogged flow"
        return best_user[best_group[1]][1]

    def _charge(self, user: str, cost: float) -> None:
        group = self._weights.group_of(user)
        self._user_counter[user] = self._user_counter.get(user, 0.0) + cost / self._weights.user_weight(user)
        self._group_counter[group] = self._group_counter.get(group, 0.0) + cost / self._weights.group_weight(group)

    def counters(self) -> dict[str, float]:
        return dict(self._user_counter)


class WeightedRoundRobinFairness(_VirtualCounterFairness):
    """Request-count shares in proportion to weights (stride scheduling): weights 1:2:4 get 1:2:4 requests.

    Trade-off: exact shares of requests, not of engine time; use `vtc` when request sizes differ a lot.
    """

    def on_dispatched(self, request: RequestView) -> None:
        self._charge(request.user, 1.0)

    def on_requeued(self, request: RequestView) -> None:
        self._charge(request.user, -1.0)


class BasicVirtualTokenCounterFairness(_VirtualCounterFairness):
    """Virtual Token Counter as published (Sheng et al., OSDI 2024): shares of tokens by weight.

    Charged `w_p * prompt tokens / weight` at dispatch and `w_q / weight` per generated token as it
    streams, so a long generation is paid for while it runs. Trade-off: the counters only see tokens
    already generated, so right after a tie a user with 1000-token answers can take several engine slots
    whose cost shows up later; shares converge only over windows of many long requests (the paper's
    bound: about 2 * max(w_p * prompt length, w_q * tokens in a batch)). `vtc` adds the look-ahead.
    """

    PROMPT_WEIGHT = 1.0
    GENERATED_WEIGHT = 2.0

    def on_dispatched(self, request: RequestView) -> None:
        self._charge(request.user, self.PROMPT_WEIGHT * request.prompt_tokens_estimate)

    def on_requeued(self, request: RequestView) -> None:
        self._charge(request.user, -self.PROMPT_WEIGHT * request.prompt_tokens_estimate)

    def on_generated(self, request: RequestView, tokens: int) -> None:
        self._charge(request.user, self.GENERATED_WEIGHT * tokens)


class VirtualTokenCounterFairness(BasicVirtualTokenCounterFairness):
    """Virtual Token Counter with length prediction (the paper's predictive variant), the default VTC.

    Counters are charged exactly as in `vtc_basic` (prompt at dispatch, tokens as they stream), but the
    choice also counts the tokens each user's running requests are still expected to generate, up to
    `scheduling.vtc_lookahead_tokens` (default 128) per request: expected length = min(max_tokens, the
    user's recent mean answer length). So a user whose 1000-token answers already hold engine slots is not
    handed another slot just because their counter has not caught up (vtc_basic's overshoot).

    Why a look-ahead limit: counting a whole 1000-token answer at dispatch charges tokens that arrive over the
    answer's entire lifetime, so after the user's running answers end together (e.g. they all started on
    an idle engine) the user gets a slot back only for every ~1000 tokens served to others, is under-served
    for a whole lifetime, then over-served: an oscillation with the period of the longest answer, 0.3x to
    1.4x in 500-step windows on the fake-clock harness. Counting the next 128 tokens keeps the brake on
    grabbing slots and settles within about 10% in those windows (1000 vs 50 tokens, 8 or 32 slots).
    Trade-off: a prediction that is too high delays a user only while their requests run.
    """

    SMOOTHING = 0.2  # weight of the newest answer in the per-user mean length

    def __init__(self, weights: WeightResolver | None = None, settings: SchedulingConfig | None = None) -> None:
        super().__init__(weights, settings)
        self._lookahead = (settings or SchedulingConfig()).vtc_lookahead_tokens
        self._remaining: dict[str, float] = {}  # request id -> tokens it is still expected to generate
        self._user_reserved: dict[str, float] = {}
        self._group_reserved: dict[str, float] = {}
        self._mean_length: dict[str, float] = {}

    def _reserve(self, user: str, tokens: float) -> None:
        cost = self.GENERATED_WEIGHT * tokens
        group = self._weights.group_of(user)
        self._user_reserved[user] = self._user_reserved.get(user, 0.0) + cost / self._weights.user_weight(user)
        self._group_reserved[group] = self._group_reserved.get(group, 0.0) + cost / self._weights.group_weight(group)

    def _counted(self, remaining: float) -> float:
        """How much of a running request's expected remainder counts against its user: the look-ahead."""
        return min(remaining, self._lookahead)

    def _user_key(self, user: str) -> float:
        return super()._user_key(user) + self._user_reserved.get(user, 0.0)

    def _group_key(self, group: str) -> float:
        return super()._group_key(group) + self._group_reserved.get(group, 0.0)

    def on_dispatched(self, request: RequestView) -> None:
        super().on_dispatched(request)
        expected = min(float(request.max_tokens), self._mean_length.get(request.user, float(request.max_tokens)))
        self._remaining[request.request_id] = expected
        self._reserve(request.user, self._counted(expected))

    def on_generated(self, request: RequestView, tokens: int) -> None:
        super().on_generated(request, tokens)
        remaining = self._remaining.get(request.request_id, 0.0)
        used = min(float(tokens), remaining)
        if used:
            self._remaining[request.request_id] = remaining - used
            self._reserve(request.user, self._counted(remaining - used) - self._counted(remaining))

    def on_requeued(self, request: RequestView) -> None:
        super().on_requeued(request)
        self._release(request)  # and no answer length to learn from

    def _release(self, request: RequestView) -> None:
        """The request no longer runs: what it was still expected to generate stops counting."""
        remaining = self._remaining.pop(request.request_id, 0.0)
        if remaining:
            self._reserve(request.user, -self._counted(remaining))

    def on_finished(self, request: RequestView, generated: int) -> None:
        self._release(request)
        previous = self._mean_length.get(request.user)
        self._mean_length[request.user] = (
            float(generated) if previous is None else previous + self.SMOOTHING * (generated - previous)
        )


FAIRNESS_POLICIES: Registry[FairnessPolicy] = Registry("fairness")
FAIRNESS_POLICIES.register("round_robin", RoundRobinFairness, "one request per backlogged user in turn")
FAIRNESS_POLICIES.register(
    "weighted_round_robin", WeightedRoundRobinFairness, "request counts in proportion to user/group weights"
)
FAIRNESS_POLICIES.register(
    "vtc",
    VirtualTokenCounterFairness,
    "Virtual Token Counter with length prediction: weighted shares of prompt + generated tokens",
)
FAIRNESS_POLICIES.register(
    "vtc_basic", BasicVirtualTokenCounterFairness, "Virtual Token Counter as published: charged as tokens stream"
)

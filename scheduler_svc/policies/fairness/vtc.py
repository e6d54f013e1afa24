"""vtc: the Virtual Token Counter with length prediction (the paper's predictive variant), the default VTC.

Counters are charged exactly as in `vtc_basic` (prompt at dispatch, tokens as they stream), but the
choice also counts the tokens each user's running requests are still expected to generate, up to
`vtc_lookahead_tokens` (default 256) per request: expected length = min(max_tokens, the
user's recent mean answer length). So a user whose 1000-token answers already hold engine slots is not
handed another slot just because their counter has not caught up (vtc_basic's overshoot).

Why a look-ahead limit: counting a whole 1000-token answer at dispatch charges tokens that arrive over the
answer's entire lifetime, so after the user's running answers end together (e.g. they all started on
an idle engine) the user gets a slot back only for every ~1000 tokens served to others, is under-served
for a whole lifetime, then over-served: an oscillation with the period of the longest answer, 0.3x to
1.4x in 500-step windows on the fake-clock harness. Counting the next 128 tokens keeps the brake on
grabbing slots and settles within about 10% in those windows (1000 vs 50 tokens, 8 or 32 slots); 256
keeps that and, on 8 slots behind a waiting queue of 3 with 8 closed-loop streams each, holds every
60 s window within 2% where 128 lets one reach 15% (priced 0.5/3) and 64 gives 1.2-1.6 throughout:
with the engine's queue in front of the slots, a dispatch is committed several slot-frees ahead, and
the key must see that far into a long answer.
Trade-off: a prediction that is too high delays a user only while their requests run.

Returning users (without the two rules below, long/short is 1.28 in every window on 8 slots with 8
closed-loop streams each): a user whose requests all sit in the engine (running, or in its waiting
queue) has an empty flow here. Two things would hand its share to the user ahead. (1) The ending of one
of its requests wakes the dispatcher at once, before the client's next request arrives, so the freed
place in the engine's queue would go to the user ahead, for a whole 1,000-token lifetime; so a choice
waits up to `vtc_return_grace_seconds` (0.2 s) for a user whose request just ended and who
is behind the one it would pick (`wake_at` tells the dispatcher when to choose again; each ending makes
choices wait at most the grace, and only while its user is behind). Only a user seen to return within
the grace after its previous answer is waited for: most of a large population sends at random (open
loop), and waiting for each of them held a slot idle in 16% of engine steps (S9's hour). (2) Its return would count as
becoming backlogged and lift it to the floor, wiping out what it is owed; so a user with requests
running keeps up to two look-aheads of tokens per running request below the floor (idle users are
lifted to it). S4 measures the shares: bench/scenarios/s4.py, docs/benchmarks.md.

Pruning: the counter rules. The mean answer length shapes the user's next
reservation, so forgetting it could change a decision whatever the counters say: it goes by the idle
TTL only (with `idle_user_ttl_seconds = 0`, never), and until then the user stays tracked.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_svc.config import setting
from scheduler_svc.core.clock import Clock
from scheduler_svc.policies.cost import Prices
from scheduler_svc.policies.fairness.base import Fairness, FairnessParams
from scheduler_svc.policies.fairness.counters import CounterAccount, LeastServed
from scheduler_svc.policies.fairness.vtc_basic import GENERATED_WEIGHT, PROMPT_WEIGHT, TokenCost
from scheduler_svc.policies.interfaces import RequestView
from scheduler_svc.policies.weights import WeightResolver

SMOOTHING = 0.2  # weight of the newest answer in the per-user mean length


@dataclass(frozen=True)
class VtcParams(FairnessParams):
    """vtc's parameters, under [scheduling]."""

    vtc_lookahead_tokens: float = setting(
        256.0,
        "vtc: how many of each running request's expected remaining tokens count against its user when "
        "choosing. 0 behaves like vtc_basic (a user with long answers can grab several slots before their "
        "cost shows); very large counts whole answers at dispatch (the paper's prediction), which makes "
        "shares swing with the period of the longest answer after long answers end together.",
        bounds=">= 0",
    )
    vtc_return_grace_seconds: float = setting(
        0.2,
        "vtc: how long a choice may wait for a user whose request just ended, who is behind the user it "
        "would pick, and who came back within this time after its previous answer (a closed-loop client "
        "sends its next request right after an answer; without the wait, the dispatch the ending triggers "
        "hands the slot to whoever is ahead). 0: never wait.",
        bounds="0 to 1",
    )


class LookAheadCost(TokenCost):
    """vtc_basic's prices, with a returning user keeping two look-aheads of tokens per running request: one
    look-ahead, the key's own slack, proved not to be enough on the fake-clock S4 (long/short 1.09)."""

    def __init__(self, lookahead: float) -> None:
        self._lookahead = lookahead

    def credit_per_request(self, prices: Prices) -> float:
        return 2 * (GENERATED_WEIGHT * prices.output) * self._lookahead


class LookAhead:
    """The tokens each running request is still expected to generate (min(max_tokens, its user's recent mean
    answer length)), counted in its user's key up to the look-ahead per request (`counters.Reservations`)."""

    def __init__(self, account: CounterAccount, lookahead: float) -> None:
        self._account = account
        self._lookahead = lookahead
        self._remaining: dict[str, float] = {}  # request id -> tokens it is still expected to generate
        self._user_reserved: dict[str, float] = {}
        self._group_reserved: dict[str, float] = {}
        self._mean_length: dict[str, float] = {}

    def user(self, user: str) -> float | None:
        return self._user_reserved.get(user, 0.0)

    def group(self, group: str) -> float | None:
        return self._group_reserved.get(group, 0.0)

    def _counted(self, remaining: float) -> float:
        """How much of a running request's expected remainder counts against its user: the look-ahead."""
        return min(remaining, self._lookahead)

    def _reserve(self, user: str, tokens: float) -> None:
        weights = self._account.weights
        cost = GENERATED_WEIGHT * self._account.prices.output * tokens
        group = weights.group_of(user)
        self._user_reserved[user] = self._user_reserved.get(user, 0.0) + cost / weights.user_weight(user)
        self._group_reserved[group] = self._group_reserved.get(group, 0.0) + cost / weights.group_weight(group)

    def dispatched(self, request: RequestView) -> None:
        most = float(request.max_tokens)
        expected = min(most, self._mean_length.get(request.user, most))
        self._remaining[request.request_id] = expected
        self._reserve(request.user, self._counted(expected))

    def generated(self, request: RequestView, tokens: int) -> None:
        remaining = self._remaining.get(request.request_id, 0.0)
        used = min(float(tokens), remaining)
        if used:
            self._remaining[request.request_id] = remaining - used
            self._reserve(request.user, self._counted(remaining - used) - self._counted(remaining))

    def released(self, request: RequestView) -> None:
        remaining = self._remaining.pop(request.request_id, 0.0)
        if remaining:
            self._reserve(request.user, -self._counted(remaining))

    def finished(self, request: RequestView, generated: int) -> None:
        previous = self._mean_length.get(request.user)
        self._mean_length[request.user] = (
            float(generated) if previous is None else previous + SMOOTHING * (generated - previous)
        )

    def all_ended(self, user: str) -> None:
        self._user_reserved.pop(user, None)

    def group_all_ended(self, group: str) -> None:
        self._group_reserved.pop(group, None)

    def forget(self, user: str, expired: bool) -> bool:
        """The mean answer length shapes the user's next reservation, so forgetting it could change a
        decision whatever the counters say: it goes by the idle TTL only."""
        if not expired:
            return user not in self._mean_length
        self._mean_length.pop(user, None)
        return True


def build(params: VtcParams, weights: WeightResolver, clock: Clock) -> Fairness:
    account = CounterAccount(
        weights,
        clock,
        params.idle_user_ttl_seconds,
        LookAheadCost(params.vtc_lookahead_tokens),
        return_grace=params.vtc_return_grace_seconds,
    )
    account.use_reservations(LookAhead(account, params.vtc_lookahead_tokens))

    def guarantee(in_flight: int, longest_answer: int, longest_prompt: int) -> float:
        """While two users of weight 1 are both backlogged, the cost each was served (prompt and generated
        tokens at the model's prices and VTC's weights) differs by at most `2 in_flight + 1` of the dearest
        request. Each choice goes to the smaller key (counter plus look-ahead, itself at most one request
        per running request); between choices, what runs ahead of the keys is what the `in_flight` requests
        the engine may hold are still to generate; a choice adds one request. So in any window of `T`
        seconds in which each user is served about `r T`, |long/short - 1| is at most twice the bound over
        `r T`. Checked with random workloads in tests/unit/test_fairness_conformance.py (`vtc_basic` does not
        keep it: without the look-ahead it drifts further on a multi-slot engine).

        The bound is a worst case (on S4's 8 slots + 3 queued, 1,000-token answers: 46,000 cost units,
        about 23,000 tokens); what S4 measures is far tighter (bench/scenarios/s4.py)."""
        prices = account.prices
        dearest = PROMPT_WEIGHT * prices.input * longest_prompt + GENERATED_WEIGHT * prices.output * longest_answer
        return (2 * in_flight + 1) * dearest

    return Fairness(LeastServed(clock), account, guarantee)

"""vtc_basic: the Virtual Token Counter as published (Sheng et al., OSDI 2024): shares of tokens by weight.

Charged `w_p * prompt tokens / weight` at dispatch and `w_q / weight` per generated token as it streams, so a
long generation is paid for while it runs. Trade-off: the counters only see tokens already generated, so
right after a tie a user with 1000-token answers can take several engine slots whose cost shows up later;
shares converge only over windows of many long requests (the paper's bound: about 2 * max(w_p * prompt
length, w_q * tokens in a batch)). `vtc` adds the look-ahead. Pruning: the counter rules (safe rule, then
the idle TTL).
"""

from __future__ import annotations

from scheduler_svc.core.clock import Clock
from scheduler_svc.policies.cost import Prices
from scheduler_svc.policies.fairness.base import Fairness, FairnessParams
from scheduler_svc.policies.fairness.counters import CounterAccount, LeastServed
from scheduler_svc.policies.interfaces import RequestView
from scheduler_svc.policies.weights import WeightResolver

PROMPT_WEIGHT = 1.0  # VTC's w_p
GENERATED_WEIGHT = 2.0  # VTC's w_q


class TokenCost:
    """A prompt token costs `PROMPT_WEIGHT` and a generated one `GENERATED_WEIGHT`, times the model's prices;
    a returning user keeps one request's credit per request it has running."""

    def dispatch_cost(self, request: RequestView, prices: Prices) -> float:
        return PROMPT_WEIGHT * prices.input * request.prompt_tokens_estimate

    def token_cost(self, prices: Prices) -> float | None:
        """What one generated token counts: VTC's weight times the model's output price."""
        return GENERATED_WEIGHT * prices.output

    def credit_per_request(self, prices: Prices) -> float:
        return 1.0

    def counts_at(self, prices: Prices) -> bool:
        return prices.input > 0 or prices.output > 0


def build(params: FairnessParams, weights: WeightResolver, clock: Clock) -> Fairness:
    return Fairness(LeastServed(clock), CounterAccount(weights, clock, params.idle_user_ttl_seconds, TokenCost()))

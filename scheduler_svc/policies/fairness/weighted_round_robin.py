"""weighted_round_robin: request-count shares in proportion to weights (stride scheduling): weights 1:2:4 get
1:2:4 requests.

Trade-off: exact shares of requests, not of engine time; use `vtc` when request sizes differ a lot.
Pruning: the counter rules (safe rule, then the idle TTL).
"""

from __future__ import annotations

from scheduler_svc.core.clock import Clock
from scheduler_svc.policies.cost import Prices
from scheduler_svc.policies.fairness.base import Fairness, FairnessParams
from scheduler_svc.policies.fairness.counters import CounterAccount, LeastServed
from scheduler_svc.policies.interfaces import RequestView
from scheduler_svc.policies.weights import WeightResolver


class PerRequest:
    """Every dispatch costs one; tokens cost nothing."""

    def dispatch_cost(self, request: RequestView, prices: Prices) -> float:
        return 1.0

    def token_cost(self, prices: Prices) -> float | None:
        return None

    def credit_per_request(self, prices: Prices) -> float:
        return 1.0  # one request's charge

    def counts_at(self, prices: Prices) -> bool:
        return True  # a request costs one at any price


def build(params: FairnessParams, weights: WeightResolver, clock: Clock) -> Fairness:
    return Fairness(LeastServed(clock), CounterAccount(weights, clock, params.idle_user_ttl_seconds, PerRequest()))

"""round_robin: one request per backlogged user in turn; fair by request count.

Trade-off: cheap and predictable, but a user asking for 1000-token answers gets 20x the engine time of one
asking for 50-token answers, and weights are ignored. A user who becomes backlogged joins the end of the
ring, so behind a flood they wait for at most one more of each other backlogged user's requests.
"""

from __future__ import annotations

from scheduler_svc.core.clock import Clock
from scheduler_svc.policies.fairness.base import Fairness, FairnessParams
from scheduler_svc.policies.fairness.turns import FirstInTurn, TurnAccount
from scheduler_svc.policies.weights import WeightResolver


def build(params: FairnessParams, weights: WeightResolver, clock: Clock) -> Fairness:
    return Fairness(FirstInTurn(), TurnAccount(weights, clock, params.idle_user_ttl_seconds))

"""A fairness policy that exists only in the tests, written the way docs/architecture.md's recipe says: one
module and one registration line. It shares prompt tokens by weight (generated tokens cost nothing), by
composing the counter policies' account and chooser with a costing of its own; the fairness conformance
suites run it beside the shipped policies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from scheduler_svc.core.clock import Clock
from scheduler_svc.policies import FAIRNESS_POLICIES, Fairness, FairnessParams, WeightResolver
from scheduler_svc.policies.cost import Prices
from scheduler_svc.policies.fairness.counters import CounterAccount, LeastServed
from scheduler_svc.policies.interfaces import RequestView

NAME = "test_prompt_share"  # test-only policies are named test_...: the golden scenarios leave them out


class PromptCost:
    """A dispatch costs its prompt at the model's input price; tokens cost nothing."""

    def dispatch_cost(self, request: RequestView, prices: Prices) -> float:
        return prices.input * request.prompt_tokens_estimate

    def token_cost(self, prices: Prices) -> float | None:
        return None

    def credit_per_request(self, prices: Prices) -> float:
        return 1.0

    def counts_at(self, prices: Prices) -> bool:
        return prices.input > 0


def build(params: FairnessParams, weights: WeightResolver, clock: Clock) -> Fairness:
    return Fairness(LeastServed(clock), CounterAccount(weights, clock, params.idle_user_ttl_seconds, PromptCost()))


@contextlib.contextmanager
def registered() -> Iterator[str]:
    """The policy registered while the block runs (the registration line a shipped policy has for good)."""
    FAIRNESS_POLICIES.register(NAME, build, "prompt-token shares by weight (tests only)", params=FairnessParams)
    try:
        yield NAME
    finally:
        FAIRNESS_POLICIES.unregister(NAME)

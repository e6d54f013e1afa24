"""Fairness policies: which user of a band is served next, chosen by `scheduling.fairness`.

Each policy is an account of the service the band's users received and a chooser that reads it (`base`);
the counter policies share `counters` (the least served first) and round robin `turns`.

    round_robin            one request per backlogged user in turn; ignores weights
    weighted_round_robin   request counts in proportion to weights (stride scheduling)
    vtc                    Virtual Token Counter with length prediction: token shares by weight
    vtc_basic              Virtual Token Counter as published (counters only; converges more slowly)

A new policy is one module (its `build`, and its parameters if it has any) and one line below. Its
parameters are keys of [scheduling], declared by its params dataclass (`base.FairnessParams` and its own
fields, each with default, values and doc); the conformance suite (tests/unit/test_fairness_conformance.py)
runs every registered policy.
"""

from scheduler_svc.policies.fairness import round_robin, vtc, vtc_basic, weighted_round_robin
from scheduler_svc.policies.fairness.base import Account, Build, Chooser, Fairness, FairnessParams
from scheduler_svc.policies.registry import Registry

FAIRNESS_POLICIES: Registry[Fairness] = Registry("fairness", table="scheduling")
FAIRNESS_POLICIES.register(
    "round_robin", round_robin.build, "one request per backlogged user in turn", params=FairnessParams
)
FAIRNESS_POLICIES.register(
    "weighted_round_robin",
    weighted_round_robin.build,
    "request counts in proportion to user/group weights",
    params=FairnessParams,
)
FAIRNESS_POLICIES.register(
    "vtc",
    vtc.build,
    "Virtual Token Counter with length prediction: weighted shares of prompt + generated tokens",
    params=vtc.VtcParams,
)
FAIRNESS_POLICIES.register(
    "vtc_basic", vtc_basic.build, "Virtual Token Counter as published: charged as tokens stream", params=FairnessParams
)

__all__ = ["FAIRNESS_POLICIES", "Account", "Build", "Chooser", "Fairness", "FairnessParams"]

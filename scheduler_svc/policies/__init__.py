"""Pluggable scheduling policies: fairness (between users), ordering (within a user), gates (backpressure)."""

from scheduler_svc.policies.fairness import (
    FAIRNESS_POLICIES,
    FairnessPolicy,
    RoundRobinFairness,
    VirtualTokenCounterFairness,
    WeightedRoundRobinFairness,
)
from scheduler_svc.policies.gate import GATE_POLICIES, Gate, GateDecision, GateInputs, QueueDepthGate, SignalGate
from scheduler_svc.policies.ordering import ORDERING_POLICIES, EdfOrdering, FcfsOrdering, OrderingPolicy
from scheduler_svc.policies.registry import Registry
from scheduler_svc.policies.weights import WeightResolver

__all__ = [
    "FAIRNESS_POLICIES",
    "GATE_POLICIES",
    "ORDERING_POLICIES",
    "EdfOrdering",
    "FairnessPolicy",
    "FcfsOrdering",
    "Gate",
    "GateDecision",
    "GateInputs",
    "OrderingPolicy",
    "QueueDepthGate",
    "Registry",
    "RoundRobinFairness",
    "SignalGate",
    "VirtualTokenCounterFairness",
    "WeightResolver",
    "WeightedRoundRobinFairness",
]

"""Pluggable scheduling policies: fairness (between users), ordering (within a user), gates (backpressure),
band choice (between priority classes), backend choice (among open backends)."""

from scheduler_svc.policies.backend_choice import (
    BACKEND_POLICIES,
    BackendPolicy,
    Candidate,
    InFlightCounts,
    LeastLoaded,
)
from scheduler_svc.policies.band import BAND_POLICIES, BandPolicy, BandTurn, StrictRankBands
from scheduler_svc.policies.configured import check_config, scheduling_params
from scheduler_svc.policies.fairness import FAIRNESS_POLICIES, Fairness, FairnessParams
from scheduler_svc.policies.gate import (
    GATE_POLICIES,
    Gate,
    GateCause,
    GateDecision,
    GateInputs,
    QueueDepthGate,
    SignalGate,
)
from scheduler_svc.policies.locality import PrefixLocality
from scheduler_svc.policies.ordering import ORDERING_POLICIES, EdfOrdering, FcfsOrdering, OrderingPolicy
from scheduler_svc.policies.registry import Registry
from scheduler_svc.policies.weights import WeightResolver

__all__ = [
    "BACKEND_POLICIES",
    "BAND_POLICIES",
    "FAIRNESS_POLICIES",
    "GATE_POLICIES",
    "ORDERING_POLICIES",
    "BackendPolicy",
    "BandPolicy",
    "BandTurn",
    "Candidate",
    "EdfOrdering",
    "Fairness",
    "FairnessParams",
    "FcfsOrdering",
    "Gate",
    "GateCause",
    "GateDecision",
    "GateInputs",
    "InFlightCounts",
    "LeastLoaded",
    "OrderingPolicy",
    "PrefixLocality",
    "QueueDepthGate",
    "Registry",
    "SignalGate",
    "StrictRankBands",
    "WeightResolver",
    "check_config",
    "scheduling_params",
]

"""What a configuration asks of the policies, checked by the policies themselves: every chosen name is
registered, the keys of [scheduling] that are no field of its own are parameters a registered policy
declares, the chosen policy's parameters are within their bounds, a priority class sets no limit its gate
would ignore, and D-LPM's bound has a locality-aware backend choice to work with.

The configuration is data and imports no policy; the loader (`app.settings`) calls `check_config` so that a
bad file is refused before the service starts, and dispatch builds each policy through the same registries.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from scheduler_svc.config import Config, ConfigError
from scheduler_svc.core.clock import MonotonicClock
from scheduler_svc.policies.backend_choice import BACKEND_POLICIES
from scheduler_svc.policies.band import BAND_POLICIES
from scheduler_svc.policies.cost import Prices
from scheduler_svc.policies.fairness import FAIRNESS_POLICIES
from scheduler_svc.policies.gate import GATE_POLICIES, ignored_limits
from scheduler_svc.policies.ordering import ORDERING_POLICIES
from scheduler_svc.policies.registry import Registry
from scheduler_svc.policies.weights import WeightResolver

# the kinds whose policies read their parameters from [scheduling]
SCHEDULING_KINDS: tuple[Registry[Any], ...] = (FAIRNESS_POLICIES, ORDERING_POLICIES, BAND_POLICIES)


def check_config(config: Config) -> None:
    """Raise ConfigError for the first thing the policies refuse in `config`."""
    scheduling = config.scheduling
    FAIRNESS_POLICIES.check(scheduling.fairness, "scheduling.fairness")
    ORDERING_POLICIES.check(scheduling.ordering, "scheduling.ordering")
    BAND_POLICIES.check(scheduling.band_policy, "scheduling.band_policy")
    declared = scheduling_params()
    unknown = sorted(set(scheduling.policy_params) - set(declared))
    if unknown:
        known = sorted({f.name for f in dataclasses.fields(scheduling) if f.name != "policy_params"} | set(declared))
        raise ConfigError(f"scheduling: unknown key(s) {unknown}; known: {known}")
    for registry in SCHEDULING_KINDS:  # every policy's own parameters, whichever is chosen: a file stays sound
        for name in registry.describe():
            registry.params(name, scheduling.policy_params)
    fairness = FAIRNESS_POLICIES.create(
        scheduling.fairness, WeightResolver(), MonotonicClock(), params=scheduling.policy_params
    )
    for model in config.models:
        where = f"models[{model.name}]"
        if not fairness.account.counts_at(Prices.of(model)):
            raise ConfigError(
                f"{where}: at input_token_cost = {model.input_token_cost:g} and output_token_cost = "
                f"{model.output_token_cost:g} fairness policy {scheduling.fairness!r} charges nothing for a request, "
                "so it would share nothing and weights would do nothing: give a token a price above 0 (a small "
                "one keeps the model nearly free in llmsched_user_cost_total)"
            )
        GATE_POLICIES.check(model.gate.policy, f"{where}.gate.policy")
        for c in scheduling.classes:
            if ignored := ignored_limits(model.gate.policy, c):
                raise ConfigError(
                    f"scheduling.classes[{c.name}] sets {', '.join(ignored)}, which gate policy "
                    f'{model.gate.policy!r} of {where} ignores: use gate.policy = "signals" or remove them'
                )
        BACKEND_POLICIES.check(model.backend_policy, f"{where}.backend_policy")
        if model.locality.deficit_bound > 0 and model.backend_policy == "least_loaded":
            raise ConfigError(
                f"{where}.locality.deficit_bound needs a locality-aware backend_policy (least_loaded always sends "
                "the fairness policy's own choice): set backend_policy or deficit_bound = 0"
            )


def scheduling_params() -> dict[str, tuple[list[str], dataclasses.Field[Any]]]:
    """Every parameter a registered policy reads from [scheduling]: key -> (the policies, its field)."""
    found: dict[str, tuple[list[str], dataclasses.Field[Any]]] = {}
    for registry in SCHEDULING_KINDS:
        for key, (names, f) in registry.declared().items():
            found.setdefault(key, ([], f))[0].extend(names)
    return found

"""Which lease decides which model, and how many leases one replica takes.

Each model has its own lease, so its decisions are led by one replica and different models by different
replicas: decision work spreads with the models. With `scheduling.fairness_scope = "global"` a user's fair-share
counter is shared by every model, so one lease (named "") covers them all and one replica decides for every
model, as the shared counter needs.

Spreading: a replica takes a free lease at once while it holds fewer than its share, ceil(leases / live
replicas); a lease nobody under their share took by the next look (a whole heartbeat later) goes to whoever
sees it free, so a lease never stays without a leader for want of a replica under its share. A replica holding
more than its share (replicas joined after it took the leases) hands one over per heartbeat.
"""

from __future__ import annotations

from scheduler_svc.config import Config

EVERY_MODEL = ""
"""The name of the one lease that covers every model (fairness_scope = "global")."""


def lease_plan(config: Config) -> dict[str, tuple[str, ...]]:
    """Lease name -> the models it decides, in the config's order."""
    models = tuple(m.name for m in config.models)
    if config.scheduling.fairness_scope == "global":
        return {EVERY_MODEL: models}
    return {model: (model,) for model in models}


def fair_share(leases: int, members: int) -> int:
    """The most leases one replica holds while `members` replicas share `leases` leases evenly."""
    return -(-leases // max(1, members))

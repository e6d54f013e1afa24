"""A replica's role and what it means for its dispatchers (`hooks.DispatchAuthority` implementations).

- leading: decides for everyone, reads the engines' metrics: the core's own `LOCAL` authority.
- following (and joining, until the first look at the lease): sends only what the leader grants, reads no
  metrics (one scrape per engine for the whole cluster, not one per replica).
- degraded (the store is unreachable): gates its own requests alone, with its normal gates plus an
  in-flight cap per backend of max(1, cap // last known replicas), so N replicas cut off from each other
  do not fill an engine N times over.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from scheduler_svc.config import ClusterConfig, ModelConfig
from scheduler_svc.dispatch.backend_handle import BackendHandle
from scheduler_svc.dispatch.steering import LOCAL, DispatchAuthority


class Role(enum.Enum):
    JOINING = "joining"
    FOLLOWING = "following"
    LEADING = "leading"
    DEGRADED = "degraded"


ROLE_LABELS = {Role.LEADING: "leader", Role.FOLLOWING: "follower", Role.DEGRADED: "degraded"}
"""The role gauge's fixed label values (joining shows as none of them)."""


class FollowingAuthority:
    """Dispatch only on the leader's grants; no scraping; queue positions as the leader last told them."""

    dispatches_locally = False
    scrapes = False

    def __init__(self, positions: Mapping[str, int]) -> None:
        self._positions = positions

    def in_flight_cap(self, handle: BackendHandle) -> int | None:
        return None

    def position(self, request_id: str) -> int | None:
        return self._positions.get(request_id)


class DegradedAuthority:
    """Gate alone, capped: the store is unreachable and the other replicas may be doing the same."""

    dispatches_locally = True
    scrapes = True

    def __init__(self, cap: int) -> None:
        self.cap = cap

    def in_flight_cap(self, handle: BackendHandle) -> int | None:
        return self.cap

    def position(self, request_id: str) -> int | None:
        return None


def degraded_cap(cluster: ClusterConfig, model: ModelConfig, members: int) -> int:
    """In-flight cap per backend for one replica gating alone: the configured cap (or the model's fallback
    cap) shared by the last known number of replicas, at least 1."""
    cap = cluster.degraded_in_flight_cap or model.gate.fallback_max_in_flight
    return max(1, cap // max(1, members))


def authority_for(
    role: Role, cluster: ClusterConfig, model: ModelConfig, members: int, positions: Mapping[str, int]
) -> DispatchAuthority:
    """The authority a model's dispatcher gets in `role` (`positions`: the leader's last Position per request)."""
    if role is Role.LEADING:
        return LOCAL
    if role is Role.DEGRADED:
        return DegradedAuthority(degraded_cap(cluster, model, members))
    return FollowingAuthority(positions)

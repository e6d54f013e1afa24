"""The cluster agent's Prometheus series: the replica's role, the models it leads, messages by type, store
errors. Every label value comes from a fixed set (roles, message type names, the configured models), never
from a client or a replica name."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from prometheus_client import CollectorRegistry

from scheduler_svc.cluster.messages import MESSAGE_TYPES
from scheduler_svc.cluster.modes import ROLE_LABELS, Role
from scheduler_svc.dispatch.metrics import Families


class ClusterMetrics:
    def __init__(self, registry: CollectorRegistry, models: Sequence[str]) -> None:
        declare = Families(registry)
        self.role = declare.gauge(
            "llmsched_cluster_role",
            "1 on this replica's current role (leader: it leads at least one model; follower; degraded), 0 on "
            "the others; all 0 while joining.",
            ("role",),
        )
        self.leading = declare.gauge(
            "llmsched_cluster_leading",
            "1 for each model whose decisions this replica leads (it holds the model's lease), 0 for the others.",
            ("model",),
        )
        self.sent = declare.counter(
            "llmsched_cluster_messages_sent_total", "Messages this replica sent to others, by type.", ("type",)
        )
        self.received = declare.counter(
            "llmsched_cluster_messages_received_total",
            "Messages this replica read from its inbox, by type (undecodable ones: type 'invalid').",
            ("type",),
        )
        self.store_errors = declare.counter(
            "llmsched_cluster_store_errors_total",
            "Calls to the cluster store that failed (unreachable): each one degrades the replica until it answers.",
        )
        self.stale_grants = declare.counter(
            "llmsched_cluster_stale_grants_total",
            "Grants ignored or answered 'ended': from a leader this replica is not registered with, or for a "
            "request no longer queued here.",
        )
        for label in ROLE_LABELS.values():
            self.role.labels(label).set(0)
        self._models = tuple(models)
        for model in self._models:
            self.leading.labels(model).set(0)
        for name in (*MESSAGE_TYPES, "invalid"):
            self.received.labels(name)
            if name != "invalid":
                self.sent.labels(name)

    def show_role(self, role: Role, leading: Collection[str]) -> None:
        for r, label in ROLE_LABELS.items():
            self.role.labels(label).set(1 if r is role else 0)
        for model in self._models:
            self.leading.labels(model).set(1 if model in leading else 0)

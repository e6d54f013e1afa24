"""The golden scenarios: one configuration per combination of the choices the dispatcher makes, each stating
every configuration value it uses, so that no change of a default can move a trace.

The combinations: every fairness policy; every ordering policy; both band setups of the strict-rank band
policy (the only one registered: lower bands wait while the best band's gate is closed; `strict` lets
them starve, `guarded` sends a starving band's request every other turn); prefix locality off
(`least_loaded`), on (`prefix_locality`) and on with the locality-aware order (`dlpm`, D-LPM's
`deficit_bound`); and users in weighted groups or each alone (round robin ignores weights and groups, so it
runs alone only). Three engines serve the model: a vLLM with priority scheduling, a llama.cpp server, and a
FIFO vLLM of unknown batch size that other clients also use and that often fails requests.

`EngineSpec` says how each fake engine behaves (what the scheduler cannot know from its configuration);
the workload is `workload.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FAIRNESS = ("round_robin", "weighted_round_robin", "vtc", "vtc_basic")
ORDERING = ("fcfs", "edf")
BANDS = ("strict", "guarded")
LOCALITY = ("off", "prefix", "dlpm")
GROUPED_FAIRNESS = ("weighted_round_robin", "vtc", "vtc_basic")  # the policies that read weights and groups
# D-LPM's bound, in each policy's counter units: requests / weight, or VTC's token cost / weight
DEFICIT_BOUND = {"round_robin": 1.0, "weighted_round_robin": 1.5, "vtc": 120.0, "vtc_basic": 120.0}
MODEL = "golden"


@dataclass(frozen=True)
class EngineSpec:
    """How one fake engine behaves."""

    slots: int  # requests it runs at once, other clients' included
    step_ms: int  # one decoding step (a token for each running request) with an empty batch ...
    step_ms_per_request: int  # ... plus this for each request in the batch
    accept_ms: int  # from the scheduler sending a request to the engine holding it (or failing it)
    serves_by_priority: bool  # its queue goes by engine priority (lower first), else in arrival order
    foreign_running: int = 0  # other clients' requests, always running here
    exports_kv_usage: bool = False
    cache_tokens: int | None = None  # its KV cache size, when its metrics say
    fail_chance: float = 0.0  # chance that it fails a request before the first token
    outage_ms: tuple[int, int] | None = None  # it fails every request sent in this window
    metrics_outage_ms: tuple[int, int] | None = None  # its metrics cannot be read in this window


ENGINES = {
    "b0": EngineSpec(
        slots=4,
        step_ms=20,
        step_ms_per_request=2,
        accept_ms=2,
        serves_by_priority=True,
        exports_kv_usage=True,
        cache_tokens=1024,
    ),
    "b1": EngineSpec(
        slots=2,
        step_ms=28,
        step_ms_per_request=6,
        accept_ms=3,
        serves_by_priority=False,
        outage_ms=(3000, 3600),
        metrics_outage_ms=(5000, 5800),
    ),
    "b2": EngineSpec(
        slots=4,
        step_ms=24,
        step_ms_per_request=3,
        accept_ms=2,
        serves_by_priority=False,
        foreign_running=1,
        exports_kv_usage=True,
        fail_chance=0.25,
    ),
}


def _backend(name: str, kind: str, priority: bool, max_num_seqs: int, scrape_seconds: float) -> dict[str, Any]:
    return {
        "name": name,
        "kind": kind,
        "url": f"http://{name}.golden.invalid:8000",
        "engine_model": "golden-engine-model",
        "priority_scheduling": priority,
        "max_num_seqs": max_num_seqs,
        "learn_max_num_seqs": False,  # b2's batch size stays unknown, as the traces were recorded
        "metrics_path": "/metrics",
        "scrape_interval_seconds": scrape_seconds,
        "connect_timeout_seconds": 5.0,
        "max_connections": 64,
        "idle_connection_seconds": 2.0,
        "drained": False,
    }


def _classes(bands: str) -> list[dict[str, Any]]:
    guarded = bands == "guarded"
    return [
        {
            "name": "interactive",
            "rank": 0,
            "engine_priority": 0,
            "waiting_target": 0,
            "max_tpot_seconds": 0.045,
            "max_kv_cache_usage": 0.0,
            "max_engine_running": 0,
            "max_engine_running_when_contended": 0,
            "contention_window_seconds": 1.0,
            "require_idle_engine": False,
            "queue_ttl_seconds": 3.0,
            "starvation_after_seconds": 0.0,
        },
        {
            "name": "review",
            "rank": 1,
            "engine_priority": 4,
            "waiting_target": 2,
            "max_tpot_seconds": 0.0,
            "max_kv_cache_usage": 0.0,
            "max_engine_running": 3,
            "max_engine_running_when_contended": 2,
            "contention_window_seconds": 0.5,
            "require_idle_engine": False,
            "queue_ttl_seconds": 0.0,
            "starvation_after_seconds": 0.8 if guarded else 0.0,
        },
        {
            "name": "batch",
            "rank": 2,
            "engine_priority": 8,
            "waiting_target": 0,
            "max_tpot_seconds": 0.0,
            "max_kv_cache_usage": 0.0,
            "max_engine_running": 0,
            "max_engine_running_when_contended": 1,
            "contention_window_seconds": 0.5,
            "require_idle_engine": True,
            "queue_ttl_seconds": 0.0,
            "starvation_after_seconds": 1.5 if guarded else 0.0,
        },
    ]


def _weights(groups: bool) -> dict[str, Any]:
    return {
        "default": 1.0,
        "users": {"u0": 1.0, "u1": 2.0, "u3": 4.0, "u5": 2.0},
        "groups": {"team-a": 2.0, "team-b": 1.0} if groups else {},
        "members": {"u0": "team-a", "u1": "team-a", "u2": "team-a", "u3": "team-b", "u4": "team-b"} if groups else {},
    }


@dataclass(frozen=True)
class Scenario:
    """One configuration of the golden trace."""

    fairness: str
    ordering: str
    bands: str
    locality: str
    groups: bool

    @property
    def name(self) -> str:
        return "-".join([self.fairness, self.ordering, self.bands, self.locality, "groups" if self.groups else "users"])

    def header(self) -> dict[str, Any]:
        """What the trace file's first line says of the scenario."""
        return {
            "scenario": self.name,
            "fairness": self.fairness,
            "ordering": self.ordering,
            "bands": self.bands,
            "locality": self.locality,
            "groups": self.groups,
        }

    def config(self) -> dict[str, Any]:
        """The whole configuration, every field stated (a test checks it), as a config file's tables."""
        return {
            "server": {
                "listen": "127.0.0.1:0",
                "metrics_listen": "",
                "http_listen": "",
                "http_max_body_bytes": 0,
                "http_max_reading_bytes": 0,
                "http_max_reading_bytes_per_user": 0,
                "http_header_timeout_seconds": 10.0,
                "http_body_timeout_seconds": 30.0,
                "http_idle_timeout_seconds": 15.0,
                "http_user_header": "x-user-id",
                "shutdown_grace_seconds": 10.0,
                "queue_update_interval_seconds": 1.0,
                "unhealthy_after_failed_passes": 3,
                "unhealthy_after_stalled_seconds": 30.0,
                "stream_read_interval_seconds": 0.05,
                "stream_read_after_tokens": 32,
                "stream_group_at_engine": True,
                "event_loop": "asyncio",
                "log_format": "console",
                "log_level": "warning",
                "tls_cert_file": "",
                "tls_key_file": "",
                "tls_client_ca_file": "",
            },
            "auth": {
                "api_key_sha256": {},
                "api_keys_file": "",
                "api_keys_env": "",
                "admin_users": [],
                "trust_user_header": False,
                "identity_from_client_cert": False,
            },
            "scheduling": {
                "fairness": self.fairness,
                "ordering": self.ordering,
                "default_class": "interactive",
                "band_policy": "strict_rank",
                "classes": _classes(self.bands),
                "weights": _weights(self.groups),
                "vtc_lookahead_tokens": 16.0,
                "fairness_scope": "model",
                "cost_accounts": {"u0": "flood", "u*": "others"},
                "vtc_return_grace_seconds": 0.2,
                "idle_user_ttl_seconds": 3.0,
                "engine_priority_per_inflight": 1,
            },
            "models": [
                {
                    "name": MODEL,
                    "default_max_tokens": 16,
                    "max_tokens_limit": 64,
                    "gate": {
                        "policy": "signals",
                        "waiting_target": 2,
                        "priority_waiting_target": 3,
                        "waiting_target_adapt_seconds": 1.0,
                        "stale_after_seconds": 0.35,
                        "fallback_max_in_flight": 2,
                        "step_model_half_life_seconds": 5.0,
                    },
                    "max_queued": 60,
                    "max_queued_per_user": 8,
                    "max_end_users_per_user": 4,
                    "max_prompt_bytes": 4096,
                    "max_queued_bytes": 1 << 20,
                    "max_queued_bytes_per_user": 1 << 18,
                    "min_retry_after_seconds": 1.0,
                    "failover_attempts": 2,
                    "failover_cooldown_seconds": 0.4,
                    "input_token_cost": 0.5,
                    "output_token_cost": 2.0,
                    "backends": [
                        _backend("b0", "vllm", priority=True, max_num_seqs=4, scrape_seconds=0.2),
                        _backend("b1", "llamacpp", priority=False, max_num_seqs=2, scrape_seconds=0.25),
                        _backend("b2", "vllm", priority=False, max_num_seqs=0, scrape_seconds=0.15),
                    ],
                    "backend_policy": "least_loaded" if self.locality == "off" else "prefix_locality",
                    "locality": {
                        "block_chars": 64,
                        "max_blocks_per_request": 8,
                        "index_max_bytes": 0,
                        "session_max_bytes": 1 << 16,
                        "session_max_bytes_per_user": 1 << 16,
                        "max_load_factor": 1.5,
                        "load_slack": 1,
                        "deficit_bound": DEFICIT_BOUND[self.fairness] if self.locality == "dlpm" else 0.0,
                        "max_candidates": 64,
                    },
                }
            ],
            "cluster": {
                "store": "memory",
                "redis_url": "redis://127.0.0.1:6379/0",
                "redis_password_file": "",
                "redis_password_env": "",
                "redis_username": "",
                "key_prefix": "llmsched",
                "replica_name": "",
                "heartbeat_interval_seconds": 0.5,
                "heartbeat_timeout_seconds": 2.0,
                "admission_wait_seconds": 1.0,
                "report_interval_seconds": 0.05,
                "degraded_in_flight_cap": 0,
            },
            "tracing": {  # spans only: no decision reads it
                "endpoint": "",
                "protocol": "grpc",
                "service_name": "llm-scheduler",
                "sampling_ratio": 1.0,
                "headers": {},
            },
        }


SCENARIOS = [
    Scenario(fairness, ordering, bands, locality, groups)
    for fairness in FAIRNESS
    for ordering in ORDERING
    for bands in BANDS
    for locality in LOCALITY
    for groups in ((False, True) if fairness in GROUPED_FAIRNESS else (False,))
]

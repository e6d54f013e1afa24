"""What the bench takes from the product, in one place: everything it needs of `scheduler_svc` and `backends`.

The bench measures the service from outside (its processes, its gRPC and HTTP doors, its metrics), but it
reads engines' metrics with the adapters' own parser and reader, so the bench and the service cannot read an
engine differently; it validates its configs with the service's own loader, so a config the service refuses
is reported as "not available" instead of a scheduler dying at start-up; and it takes a few shipped defaults
so its setups run the service as it ships. Every such import is here: the rest of the bench imports this
module, the public client package (`clients`) and the engine tools (`engines`), never the service's modules.
"""

from __future__ import annotations

import sys
from typing import Any

import aiohttp

from backends._http import engine_connector
from backends._metrics_reader import MetricsReader, MetricsStatus
from backends._prom import MetricSamples, selected_metrics
from backends.base import HttpSettings
from backends.sim.journal import read_journal
from backends.vllm import VllmBackend
from scheduler_svc.config import ConfigError, SchedulingConfig, config_from_dict
from scheduler_svc.config_schema import BackendConfig
from scheduler_svc.event_loop import EVENT_LOOPS

__all__ = [
    "EVENT_LOOPS",
    "SERVICE_COMMAND",
    "SHIPPED_SCRAPE_INTERVAL",
    "VLLM_METRICS",
    "VTC_RETURN_GRACE",
    "ConfigRefused",
    "MetricSamples",
    "MetricsReader",
    "MetricsStatus",
    "engine_pool",
    "read_journal",
    "selected_metrics",
    "validate_config",
]

# `llmsched` run from this checkout's code: `SERVICE_COMMAND + ("serve", ...)`, `SERVICE_COMMAND + ("sim", ...)`
SERVICE_COMMAND = (sys.executable, "-m", "scheduler_svc.cli")
# how often a backend's metrics are read when its config does not say (configs/example.toml sets the same)
SHIPPED_SCRAPE_INTERVAL = BackendConfig.scrape_interval_seconds
# vtc's return grace as shipped: a user whose next request comes later than this forfeits its place
VTC_RETURN_GRACE = SchedulingConfig().vtc_return_grace_seconds
# the samples the vLLM adapter reads from an engine's /metrics
VLLM_METRICS = VllmBackend.METRICS


class ConfigRefused(Exception):
    """The service's own loader refuses a config (an unknown policy, a missing or misspelt key)."""


def validate_config(config: dict[str, Any]) -> None:
    """Check `config` (the parsed TOML) with the service's own loader; raises `ConfigRefused` with its message."""
    try:
        config_from_dict(config)
    except (ConfigError, TypeError) as exc:
        raise ConfigRefused(str(exc)) from exc


def engine_pool(*, force_close: bool = False) -> aiohttp.TCPConnector:
    """A connection pool towards an engine, as the service's adapters keep one: no limit, idle connections
    closed before the engine's own keep-alive does (a request sent on a connection the engine is closing
    fails with "Server disconnected"), none reused with `force_close` (llama-server closes after each
    streamed response)."""
    return engine_connector(0, force_close=force_close, idle_seconds=HttpSettings().idle_connection_seconds)

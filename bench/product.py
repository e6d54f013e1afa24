"""What the bench takes from the product, in one place: everything it needs of `scheduler_svc` and `backends`.

The bench measures the service from outside (its processes, its gRPC and HTTP doors, its metrics), but it
reads engines' metrics with the adapters' own parser and reader, so the bench and the service cannot read an
engine differently; it validates its configs with the service's own loader, so a config the service refuses
is reported as "not available" instead of a scheduler dying at start-up; it takes a few shipped defaults so
its setups run the service as it ships; CN speaks the cluster's wire protocol to one leader; and the scrape
tool times the adapters and the real `Scheduler` in-process; S9 runs the core on a stepped clock
(`SteppedCore`) against its own model of the simulator's engine (`step_seconds`, `PrefixCache`), with the
index-free fairness and gate baselines it builds from the policy registries. Every such import is here or,
for the core alone, in `bench.product_core`, which this module re-exports: the rest of the bench imports
this module, the public client package (`clients`) and the engine tools (`engines`), never the service's
modules, so a rename there is one edit here.
"""

from __future__ import annotations

import sys
from typing import Any

import aiohttp

from backends.adapters import HttpAdapter
from backends.adapters.llamacpp import LlamaCppBackend
from backends.adapters.tgi import TgiBackend
from backends.adapters.vllm import VllmBackend
from backends.base import BackendLoad, HttpSettings
from backends.http import engine_connector
from backends.metrics import MetricSamples, selected_metrics, whole_text_samples
from backends.metrics_reader import MetricsReader, MetricsStatus, SampleParser
from backends.sim import SimConfig, running_simulator
from backends.sim.engine import step_seconds
from backends.sim.journal import read_journal
from backends.sim.prefix_cache import PrefixCache
from bench.product_core import ConfigRefused, Refused, Sent, SteppedCore, configure_logging, load_config
from scheduler_svc.app.event_loop import EVENT_LOOPS, run_on
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.app.settings import load_config as load_config_file
from scheduler_svc.cluster.messages import (
    Admit,
    Fail,
    Grant,
    Message,
    Report,
    Tokens,
    Verdict,
    decode_batch,
    encode_batch,
)
from scheduler_svc.cluster.redis_store import INBOX_LIMIT, RedisStore, inbox_key
from scheduler_svc.config import BackendConfig, GateConfig, PriorityClassConfig, ServerConfig
from scheduler_svc.dispatch.scheduler import Scheduler
from scheduler_svc.policies import FAIRNESS_POLICIES, GATE_POLICIES, Fairness, GateDecision, GateInputs, SignalGate
from scheduler_svc.policies.fairness.backlog_scan import BacklogScan
from scheduler_svc.policies.fairness.counters import CounterAccount
from scheduler_svc.policies.fairness.vtc import VtcParams
from scheduler_svc.policies.weights import WeightResolver

__all__ = [
    "EVENT_LOOPS",
    "FAIRNESS_POLICIES",
    "GATE_POLICIES",
    "INBOX_LIMIT",
    "SERVICE_COMMAND",
    "SHIPPED_SCRAPE_INTERVAL",
    "VLLM_METRICS",
    "VTC_RETURN_GRACE",
    "Admit",
    "BackendConfig",
    "BackendLoad",
    "BacklogScan",
    "ConfigRefused",
    "CounterAccount",
    "Fail",
    "Fairness",
    "GateConfig",
    "GateDecision",
    "GateInputs",
    "Grant",
    "HttpAdapter",
    "LlamaCppBackend",
    "Message",
    "MetricSamples",
    "MetricsReader",
    "MetricsStatus",
    "PrefixCache",
    "PriorityClassConfig",
    "RedisStore",
    "Refused",
    "Report",
    "SampleParser",
    "Scheduler",
    "SchedulerServer",
    "Sent",
    "ServerConfig",
    "SignalGate",
    "SimConfig",
    "SteppedCore",
    "TgiBackend",
    "Tokens",
    "Verdict",
    "VllmBackend",
    "WeightResolver",
    "configure_logging",
    "decode_batch",
    "encode_batch",
    "engine_pool",
    "inbox_key",
    "load_config",
    "load_config_file",
    "read_journal",
    "run_on",
    "running_simulator",
    "selected_metrics",
    "step_seconds",
    "validate_config",
    "whole_text_samples",
]

# `llmsched` run from this checkout's code: `SERVICE_COMMAND + ("serve", ...)`, `SERVICE_COMMAND + ("sim", ...)`
SERVICE_COMMAND = (sys.executable, "-m", "scheduler_svc.app.cli")
# how often a backend's metrics are read when its config does not say (configs/example.toml sets the same)
SHIPPED_SCRAPE_INTERVAL = BackendConfig.scrape_interval_seconds
# vtc's return grace as shipped: a user whose next request comes later than this forfeits its place
VTC_RETURN_GRACE = VtcParams().vtc_return_grace_seconds
# the samples the vLLM adapter reads from an engine's /metrics
VLLM_METRICS = VllmBackend.METRICS


def validate_config(config: dict[str, Any]) -> None:
    """Check `config` (the parsed TOML) with the service's own loader; raises `ConfigRefused` with its message."""
    load_config(config)


def engine_pool(*, force_close: bool = False) -> aiohttp.TCPConnector:
    """A connection pool towards an engine, as the service's adapters keep one: no limit, idle connections
    closed before the engine's own keep-alive does (a request sent on a connection the engine is closing
    fails with "Server disconnected"), none reused with `force_close` (llama-server closes after each
    streamed response)."""
    return engine_connector(0, force_close=force_close, idle_seconds=HttpSettings().idle_connection_seconds)

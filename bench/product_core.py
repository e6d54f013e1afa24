"""What the in-process benches take of the product's core, apart from the rest of `bench.product`.

The core (`SteppedCore`, configuration from a dict, logging) imports nothing of the faces, so a process that
takes only this module holds the core alone: S9's memory part measures a fresh interpreter's resident
memory with requests queued, which must not count gRPC, protobuf, OpenTelemetry or the Redis client,
libraries the core never loads (its vLLM adapters do load aiohttp). `bench.product` re-exports every name
here; only such a process imports this module directly.
"""

from __future__ import annotations

from typing import Any

from scheduler_svc.app.logs import configure_logging
from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.app.stepped import Refused, Sent, SteppedCore
from scheduler_svc.config import Config, ConfigError

__all__ = ["ConfigRefused", "Refused", "Sent", "SteppedCore", "configure_logging", "load_config"]


class ConfigRefused(Exception):
    """The service's own loader refuses a config (an unknown policy, a missing or misspelt key)."""


def load_config(config: dict[str, Any]) -> Config:
    """The service's own configuration from `config` (the parsed TOML); raises `ConfigRefused` with its message."""
    try:
        return config_from_dict(config)
    except (ConfigError, TypeError) as exc:
        raise ConfigRefused(str(exc)) from exc

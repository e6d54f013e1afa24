"""The configuration as data: frozen dataclasses, each field with its default, doc and accepted values at the
field (`schema`, declared and checked by `fields`). It imports nothing of the service but the backend
registry's list of engine kinds; the TOML file is read and checked by `scheduler_svc.app.settings`, and the
policies build their own parameters with the same `fields`."""

from scheduler_svc.config.fields import ConfigError, build, check_bounds, setting
from scheduler_svc.config.schema import (
    DEFAULT_CLASSES,
    AuthConfig,
    BackendConfig,
    ClusterConfig,
    Config,
    GateConfig,
    LocalityConfig,
    ModelConfig,
    PriorityClassConfig,
    SchedulingConfig,
    ServerConfig,
    TracingConfig,
    WeightsConfig,
    describe_fields,
)

__all__ = [
    "DEFAULT_CLASSES",
    "AuthConfig",
    "BackendConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "GateConfig",
    "LocalityConfig",
    "ModelConfig",
    "PriorityClassConfig",
    "SchedulingConfig",
    "ServerConfig",
    "TracingConfig",
    "WeightsConfig",
    "build",
    "check_bounds",
    "describe_fields",
    "setting",
]

"""The configuration as data: frozen dataclasses, each field with its default and doc (`schema`). It imports
nothing of the service but the backend registry's list of engine kinds; the TOML file is read and checked
by `scheduler_svc.app.settings`."""

from scheduler_svc.config.schema import (
    DEFAULT_CLASSES,
    AuthConfig,
    BackendConfig,
    ClusterConfig,
    Config,
    ConfigError,
    GateConfig,
    LocalityConfig,
    ModelConfig,
    PriorityClassConfig,
    SchedulingConfig,
    ServerConfig,
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
    "WeightsConfig",
    "describe_fields",
]

"""The service's configuration: one TOML file, built and validated here and nowhere else.

The sections' shapes live in `scheduler_svc.config_schema` (re-exported here). Unknown keys are errors, so a
typo never silently falls back to a default. Validation checks names against the policy registries and
each backend's kind against `backends.registry`, whose adapters' capability flags (`has_tpot`,
`has_kv_usage`) say which class limits an engine of that kind can observe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from backends.registry import BACKEND_KINDS, capabilities
from scheduler_svc.config_schema import (
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
from scheduler_svc.event_loop import EVENT_LOOPS
from scheduler_svc.identity import user_id_problem
from scheduler_svc.keys import load_key_digests
from scheduler_svc.policies import (
    BACKEND_POLICIES,
    BAND_POLICIES,
    FAIRNESS_POLICIES,
    GATE_POLICIES,
    ORDERING_POLICIES,
)
from scheduler_svc.policies.gate import ignored_limits
from scheduler_svc.tls import ServerTls

T = TypeVar("T")

# class limits that need an engine signal -> the BackendCapabilities flag saying a kind's adapter exports it
SIGNAL_LIMITS = {"max_tpot_seconds": "has_tpot", "max_kv_cache_usage": "has_kv_usage"}
MAX_PROMPT_BYTES_LIMIT = 64 << 20  # a request larger than this is no prompt; gRPC messages stay well under 2 GB

__all__ = [
    "BACKEND_KINDS",
    "DEFAULT_CLASSES",
    "MAX_PROMPT_BYTES_LIMIT",
    "SIGNAL_LIMITS",
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
    "config_from_dict",
    "describe_fields",
    "load_config",
    "observable_limits",
]


def load_config(path: str | Path) -> Config:
    """Read and validate a TOML configuration file."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return config_from_dict(raw)


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Build and validate a Config from parsed TOML."""
    _reject_plain_api_keys(raw)
    config = _build(Config, raw, "")
    _validate(config)
    return config


def _build(cls: type[T], raw: Any, where: str) -> T:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where or 'top level'}: expected a table, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f"{where or 'top level'}: unknown key(s) {unknown}; known: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    values = {name: _convert(hints[name], raw[name], f"{where}{name}") for name in raw}
    return cls(**values)


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where + ".")  # type: ignore[arg-type]
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list")
        return [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_type, value_type = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table")
        return {_convert(key_type, k, where): _convert(value_type, v, f"{where}.{k}") for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        raise ConfigError(f"{where}: unsupported union type")  # not used by any field
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


def observable_limits(kind: str) -> frozenset[str]:
    """The signal limits an engine of `kind` can observe, from its adapter's capability flags (this imports
    that adapter's module, and no other)."""
    caps = capabilities(kind)
    return frozenset(limit for limit, flag in SIGNAL_LIMITS.items() if getattr(caps, flag))


def _validate(config: Config) -> None:
    _validate_identity(config)
    _validate_cluster(config.cluster)
    if not config.models:
        raise ConfigError("models: configure at least one [[models]] entry")
    if config.server.unhealthy_after_failed_passes < 1 or config.server.unhealthy_after_stalled_seconds < 0:
        raise ConfigError("server: unhealthy_after_failed_passes must be >= 1, unhealthy_after_stalled_seconds >= 0")
    _validate_http(config)
    if not (
        config.server.stream_read_interval_seconds == 0 or 0.005 <= config.server.stream_read_interval_seconds <= 1
    ):
        raise ConfigError(
            "server.stream_read_interval_seconds: 0 (off), or 0.005 to 1 (a shorter grid costs more than it saves)"
        )
    if config.server.stream_read_after_tokens < 0:
        raise ConfigError("server.stream_read_after_tokens: 0 or more")
    if config.server.event_loop not in EVENT_LOOPS:
        raise ConfigError(f"server.event_loop {config.server.event_loop!r}: one of {', '.join(EVENT_LOOPS)}")
    if not re.fullmatch(r"[a-z0-9-]{1,64}", config.server.http_user_header):
        raise ConfigError("server.http_user_header: 1-64 lower-case letters, digits and dashes")
    FAIRNESS_POLICIES.check(config.scheduling.fairness, "scheduling.fairness")
    ORDERING_POLICIES.check(config.scheduling.ordering, "scheduling.ordering")
    BAND_POLICIES.check(config.scheduling.band_policy, "scheduling.band_policy")
    class_names = [c.name for c in config.scheduling.classes]
    if not class_names or len(set(class_names)) != len(class_names) or "" in class_names:
        raise ConfigError(f"scheduling.classes: need at least one, with unique non-empty names: {class_names}")
    if config.scheduling.default_class not in class_names:
        raise ConfigError(f"scheduling.default_class {config.scheduling.default_class!r} is not one of {class_names}")
    for c in config.scheduling.classes:
        limits = (
            "waiting_target",
            "max_engine_running",
            "max_engine_running_when_contended",
            "contention_window_seconds",
            "max_tpot_seconds",
            "max_kv_cache_usage",
            "queue_ttl_seconds",
            "starvation_after_seconds",
        )
        if negative := [name for name in limits if getattr(c, name) < 0]:
            raise ConfigError(f"scheduling.classes[{c.name}]: {', '.join(negative)} must not be negative")
        if c.max_kv_cache_usage > 1:
            raise ConfigError(f"scheduling.classes[{c.name}]: max_kv_cache_usage is a share, 0 to 1")
    if config.scheduling.idle_user_ttl_seconds < 0:
        raise ConfigError("scheduling.idle_user_ttl_seconds must not be negative")
    if config.scheduling.vtc_lookahead_tokens < 0:
        raise ConfigError("scheduling.vtc_lookahead_tokens must not be negative")
    if config.scheduling.vtc_return_grace_seconds < 0 or config.scheduling.vtc_return_grace_seconds > 1:
        raise ConfigError("scheduling.vtc_return_grace_seconds must be between 0 and 1")
    if config.scheduling.fairness_scope not in ("model", "global"):
        raise ConfigError(
            f"scheduling.fairness_scope must be 'model' or 'global', not {config.scheduling.fairness_scope!r}"
        )
    for pattern, label in config.scheduling.cost_accounts.items():
        if not pattern or pattern == "*" or "*" in pattern[:-1] or not label or len(label) > 64:
            raise ConfigError(
                f"scheduling.cost_accounts: {pattern!r} = {label!r}: a user id or a prefix ending in '*', "
                "to a non-empty label of at most 64 characters"
            )
    weights = config.scheduling.weights
    if weights.default <= 0 or any(w <= 0 for w in [*weights.users.values(), *weights.groups.values()]):
        raise ConfigError("scheduling.weights: the default and every weight must be > 0")
    names = [m.name for m in config.models]
    if len(set(names)) != len(names) or "" in names:
        raise ConfigError(f"models: names must be unique and non-empty: {names}")
    for model in config.models:
        where = f"models[{model.name}]"
        GATE_POLICIES.check(model.gate.policy, f"{where}.gate.policy")
        if model.gate.waiting_target < 1 or model.gate.fallback_max_in_flight < 1:
            raise ConfigError(f"{where}.gate: waiting_target and fallback_max_in_flight must be >= 1")
        if model.gate.waiting_target_adapt_seconds < 0:
            raise ConfigError(f"{where}.gate: waiting_target_adapt_seconds must be >= 0 (0: always waiting_target)")
        if model.gate.priority_waiting_target < 0:
            raise ConfigError(f"{where}.gate: priority_waiting_target must be >= 0 (0: waiting_target)")
        if model.gate.step_model_half_life_seconds <= 0:
            raise ConfigError(f"{where}.gate: step_model_half_life_seconds must be > 0")
        for c in config.scheduling.classes:
            if ignored := ignored_limits(model.gate.policy, c):
                raise ConfigError(
                    f"scheduling.classes[{c.name}] sets {', '.join(ignored)}, which gate policy "
                    f'{model.gate.policy!r} of {where} ignores: use gate.policy = "signals" or remove them'
                )
        for price in (model.input_token_cost, model.output_token_cost):
            if not math.isfinite(price) or price < 0 or price > 1e6:
                raise ConfigError(f"{where}: input_token_cost and output_token_cost must be between 0 and 1e6")
        if model.max_queued < 1 or model.max_queued_per_user < 1:
            raise ConfigError(f"{where}: max_queued and max_queued_per_user must be >= 1")
        if min(model.max_prompt_bytes, model.max_queued_bytes, model.max_queued_bytes_per_user) < 1:
            raise ConfigError(f"{where}: max_prompt_bytes, max_queued_bytes and max_queued_bytes_per_user must be >= 1")
        if model.max_prompt_bytes > MAX_PROMPT_BYTES_LIMIT:
            raise ConfigError(f"{where}: max_prompt_bytes is at most {MAX_PROMPT_BYTES_LIMIT}")
        if not 0.001 <= model.min_retry_after_seconds <= 300:
            raise ConfigError(f"{where}: min_retry_after_seconds must be between 0.001 and 300")
        if model.failover_attempts < 0 or model.failover_cooldown_seconds < 0:
            raise ConfigError(f"{where}: failover_attempts and failover_cooldown_seconds must be >= 0")
        if not 1 <= model.default_max_tokens <= model.max_tokens_limit:
            raise ConfigError(f"{where}: need 1 <= default_max_tokens <= max_tokens_limit")
        if not model.backends:
            raise ConfigError(f"{where}: configure at least one backend")
        _validate_locality(model, where)
        backend_names = [b.name for b in model.backends]
        if len(set(backend_names)) != len(backend_names) or "" in backend_names:
            raise ConfigError(f"{where}.backends: names must be unique and non-empty: {backend_names}")
        for backend in model.backends:
            if backend.kind not in BACKEND_KINDS:
                raise ConfigError(
                    f"{where}.backends[{backend.name}].kind {backend.kind!r}: known kinds {BACKEND_KINDS}"
                )
            if not backend.url.startswith(("http://", "https://")):
                raise ConfigError(f"{where}.backends[{backend.name}].url must be http(s)://...")
            if backend.scrape_interval_seconds <= 0:
                raise ConfigError(f"{where}.backends[{backend.name}]: scrape_interval_seconds must be > 0")
            if backend.idle_connection_seconds <= 0:
                raise ConfigError(f"{where}.backends[{backend.name}]: idle_connection_seconds must be > 0")
            observed = observable_limits(backend.kind)
            for c in config.scheduling.classes:
                blind = [n for n in SIGNAL_LIMITS if getattr(c, n) and n not in observed]
                if blind:
                    raise ConfigError(
                        f"scheduling.classes[{c.name}] sets {', '.join(blind)}, but {where}.backends"
                        f"[{backend.name}] ({backend.kind}) does not export that signal: the limit would never bind"
                    )


_CLUSTER_STORES = ("memory", "redis")
_REPLICA_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_KEY_PREFIX = re.compile(r"[A-Za-z0-9._:-]{1,64}")


# The HTTP door's body bounds, worked out from the configuration (0 means derived) in this one place.
BODY_MARGIN_BYTES = 256 * 1024  # room for the fields besides the prompt
READING_BODIES = 16  # http_max_reading_bytes = 0: this many largest bodies at once, all callers
READING_BODIES_PER_USER = 4  # http_max_reading_bytes_per_user = 0: this many for one caller


def http_body_limit(config: Config) -> int:
    """The largest HTTP request body: configured, else twice the largest prompt (JSON escaping) plus room
    for the other fields."""
    largest_prompt = max((model.max_prompt_bytes for model in config.models), default=0)
    return config.server.http_max_body_bytes or 2 * largest_prompt + BODY_MARGIN_BYTES


def http_reading_limits(config: Config) -> tuple[int, int]:
    """Body bytes the HTTP door holds while reading, all callers and per caller (configured, else derived)."""
    body = http_body_limit(config)
    server = config.server
    return (
        server.http_max_reading_bytes or READING_BODIES * body,
        server.http_max_reading_bytes_per_user or READING_BODIES_PER_USER * body,
    )


def _validate_http(config: Config) -> None:
    server = config.server
    for name in ("http_max_body_bytes", "http_max_reading_bytes", "http_max_reading_bytes_per_user"):
        if getattr(server, name) < 0:
            raise ConfigError(f"server.{name} must be >= 0 (0: derived)")
    for name in ("http_header_timeout_seconds", "http_body_timeout_seconds", "http_idle_timeout_seconds"):
        if not getattr(server, name) > 0:
            raise ConfigError(f"server.{name} must be > 0")
    body = http_body_limit(config)
    total, per_user = http_reading_limits(config)
    if not body <= per_user <= total:
        raise ConfigError(
            f"server.http_max_reading_bytes_per_user ({per_user}) must be at least the body limit ({body}) and at "
            f"most server.http_max_reading_bytes ({total}), or a body could never be read"
        )


def _validate_cluster(cluster: ClusterConfig) -> None:
    """Checked whatever the store, so a file that switches to Redis later is already sound (and never holds a
    password)."""
    if cluster.store not in _CLUSTER_STORES:
        raise ConfigError(f"cluster.store {cluster.store!r}: one of {list(_CLUSTER_STORES)}")
    _validate_redis_url(cluster.redis_url)
    if cluster.redis_password_file and cluster.redis_password_env:
        raise ConfigError("cluster: set redis_password_file or redis_password_env, not both")
    if cluster.redis_username and not (cluster.redis_password_file or cluster.redis_password_env):
        raise ConfigError("cluster.redis_username needs a password: redis_password_file or redis_password_env")
    if cluster.replica_name and not _REPLICA_NAME.fullmatch(cluster.replica_name):
        raise ConfigError("cluster.replica_name: 1-64 letters, digits, '.', '_' or '-' (empty: host name and port)")
    if not _KEY_PREFIX.fullmatch(cluster.key_prefix):
        raise ConfigError("cluster.key_prefix: 1-64 letters, digits, '.', '_', ':' or '-'")
    interval, timeout = cluster.heartbeat_interval_seconds, cluster.heartbeat_timeout_seconds
    if not (math.isfinite(timeout) and interval > 0 and 2 * interval <= timeout):
        raise ConfigError(
            "cluster: need 0 < heartbeat_interval_seconds and heartbeat_timeout_seconds >= 2 x the interval "
            f"(a replica must miss at least two heartbeats before it is dead), got {interval} and {timeout}"
        )
    for name in ("admission_wait_seconds", "report_interval_seconds"):
        value = getattr(cluster, name)
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"cluster.{name} must be > 0, got {value}")
    if cluster.degraded_in_flight_cap < 0:
        raise ConfigError("cluster.degraded_in_flight_cap must be >= 0 (0: the model's gate.fallback_max_in_flight)")


def _validate_redis_url(url: str) -> None:
    """Credentials are checked first, so no message below ever echoes a URL holding a password."""
    parts = urlsplit(url)
    query = {key.lower() for key in parse_qs(parts.query)}
    if "@" in parts.netloc or query & {"password", "username"}:
        raise ConfigError(
            "cluster.redis_url must not carry a user or password (the config file is no place for secrets): put "
            "the password in the file named by cluster.redis_password_file or the environment variable named by "
            "cluster.redis_password_env, and the ACL user in cluster.redis_username"
        )
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(f"cluster.redis_url {url!r}: redis://host:port/db, rediss://... (TLS) or unix:///path")
    if not (parts.path if parts.scheme == "unix" else parts.hostname):
        raise ConfigError(f"cluster.redis_url {url!r} names no host (or, for unix://, no socket path)")
    try:
        parts.port  # noqa: B018 (parsing the port is the check)
    except ValueError as exc:
        raise ConfigError(f"cluster.redis_url {url!r}: {exc}") from exc


def _validate_locality(model: ModelConfig, where: str) -> None:
    """The backend policy is known, the locality bounds are in range, and D-LPM has a policy that uses it."""
    BACKEND_POLICIES.check(model.backend_policy, f"{where}.backend_policy")
    loc = model.locality
    if loc.block_chars < 1 or loc.max_blocks_per_request < 1:
        raise ConfigError(f"{where}.locality: block_chars and max_blocks_per_request must be >= 1")
    if (
        min(
            loc.index_max_bytes,
            loc.session_max_bytes,
            loc.session_max_bytes_per_user,
            loc.load_slack,
            loc.deficit_bound,
        )
        < 0
    ):
        raise ConfigError(
            f"{where}.locality: index_max_bytes, session_max_bytes, session_max_bytes_per_user, load_slack and "
            "deficit_bound must not be negative"
        )
    if loc.max_load_factor < 1:
        raise ConfigError(f"{where}.locality.max_load_factor must be >= 1 (the model's average load)")
    if loc.deficit_bound > 0 and model.backend_policy == "least_loaded":
        raise ConfigError(
            f"{where}.locality.deficit_bound needs a locality-aware backend_policy (least_loaded always sends "
            "the fairness policy's own choice): set backend_policy or deficit_bound = 0"
        )


def _reject_plain_api_keys(raw: dict[str, Any]) -> None:
    """A plain-text `auth.api_keys` table is refused, with the digests to put in its place."""
    auth = raw.get("auth")
    if not isinstance(auth, dict) or "api_keys" not in auth:
        return
    keys = auth["api_keys"] if isinstance(auth["api_keys"], dict) else {}
    digests = ", ".join(
        f'"{hashlib.sha256(str(key).encode()).hexdigest()}" = {json.dumps(str(user))}' for key, user in keys.items()
    )
    raise ConfigError(
        "auth.api_keys: plain-text API keys are no longer accepted in the configuration. Store their SHA-256 "
        "digests instead (`printf %s KEY | sha256sum` or `llmsched hash-key`), for these keys: "
        f"api_key_sha256 = {{ {digests} }}; or move the keys to the file named by auth.api_keys_file or the "
        "environment variable named by auth.api_keys_env (lines of `<user> <key>`)."
    )


def _validate_identity(config: Config) -> None:
    """Users named in the config have the user-id form, and no setup lets a caller pick its own identity."""
    auth = config.auth
    weights = config.scheduling.weights
    named = [
        *(("auth.admin_users", user) for user in auth.admin_users),
        *(("scheduling.weights.users", user) for user in weights.users),
        *(("scheduling.weights.members", user) for user in weights.members),
    ]
    for where, user in named:
        if problem := user_id_problem(user):
            raise ConfigError(f"{where}: {problem}")
    has_keys = bool(load_key_digests(auth))
    tls = ServerTls.from_config(config.server)
    if auth.identity_from_client_cert:
        if tls is None or not tls.mutual:
            raise ConfigError("auth.identity_from_client_cert needs server.tls_client_ca_file (mutual TLS)")
        if has_keys:
            raise ConfigError(
                "auth.identity_from_client_cert cannot be combined with API keys: choose one source of identity"
            )
    if auth.admin_users and not (has_keys or auth.identity_from_client_cert or auth.trust_user_header):
        raise ConfigError(
            "auth.admin_users without API keys or client-certificate identity lets anyone become an admin by "
            "sending `x-user-id`. Configure API keys (auth.api_key_sha256, api_keys_file or api_keys_env) or "
            "auth.identity_from_client_cert; or, only if a trusted proxy sets x-user-id, set "
            "auth.trust_user_header = true."
        )

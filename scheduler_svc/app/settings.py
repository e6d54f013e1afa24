"""The service's configuration: one TOML file, read and checked here before the service starts.

The sections' shapes are data in `scheduler_svc.config`, each field with its default, doc and bounds, which
`config.check_bounds` applies to every field. Unknown keys are errors, so a typo never silently falls back
to a default. What is checked here is what no single field can say: rules between fields (the default
class is a class, the default max_tokens is within the limit, names are unique), identity and TLS, the
cluster's store, and each backend's kind against `backends.registry`, whose adapters' capability flags
(`has_tpot`, `has_kv_usage`) say which class limits an engine of that kind can observe. The policies check
what is theirs (`policies.check_config`: names, their own parameters).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from backends.registry import BACKEND_KINDS, capabilities
from scheduler_svc.app.event_loop import EVENT_LOOPS
from scheduler_svc.app.tls import ServerTls
from scheduler_svc.config import ClusterConfig, Config, ConfigError, TracingConfig, build, check_bounds
from scheduler_svc.config.derived import check_http_bounds
from scheduler_svc.core.identity import user_id_problem
from scheduler_svc.core.keys import load_key_digests
from scheduler_svc.policies import check_config

# class limits that need an engine signal -> the BackendCapabilities flag saying a kind's adapter exports it
SIGNAL_LIMITS = {"max_tpot_seconds": "has_tpot", "max_kv_cache_usage": "has_kv_usage"}
MAX_PROMPT_BYTES_LIMIT = 64 << 20  # a request larger than this is no prompt; gRPC messages stay well under 2 GB

__all__ = ["MAX_PROMPT_BYTES_LIMIT", "SIGNAL_LIMITS", "config_from_dict", "load_config", "observable_limits"]


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
    config = build(Config, raw)
    check_bounds(config)
    _validate(config)
    check_config(config)
    return config


def observable_limits(kind: str) -> frozenset[str]:
    """The signal limits an engine of `kind` can observe, from its adapter's capability flags (this imports
    that adapter's module, and no other)."""
    caps = capabilities(kind)
    return frozenset(limit for limit, flag in SIGNAL_LIMITS.items() if getattr(caps, flag))


def _validate(config: Config) -> None:
    _validate_identity(config)
    _validate_cluster(config.cluster)
    _validate_tracing(config.tracing)
    if not config.models:
        raise ConfigError("models: configure at least one [[models]] entry")
    if config.server.event_loop not in EVENT_LOOPS:
        raise ConfigError(f"server.event_loop {config.server.event_loop!r}: one of {', '.join(EVENT_LOOPS)}")
    check_http_bounds(config)
    if not re.fullmatch(r"[a-z0-9-]{1,64}", config.server.http_user_header):
        raise ConfigError("server.http_user_header: 1-64 lower-case letters, digits and dashes")
    class_names = [c.name for c in config.scheduling.classes]
    if not class_names or len(set(class_names)) != len(class_names) or "" in class_names:
        raise ConfigError(f"scheduling.classes: need at least one, with unique non-empty names: {class_names}")
    if config.scheduling.default_class not in class_names:
        raise ConfigError(f"scheduling.default_class {config.scheduling.default_class!r} is not one of {class_names}")
    for pattern, label in config.scheduling.cost_accounts.items():
        if not pattern or pattern == "*" or "*" in pattern[:-1] or not label or len(label) > 64:
            raise ConfigError(
                f"scheduling.cost_accounts: {pattern!r} = {label!r}: a user id or a prefix ending in '*', "
                "to a non-empty label of at most 64 characters"
            )
    names = [m.name for m in config.models]
    if len(set(names)) != len(names) or "" in names:
        raise ConfigError(f"models: names must be unique and non-empty: {names}")
    for model in config.models:
        where = f"models[{model.name}]"
        if not 1 <= model.default_max_tokens <= model.max_tokens_limit:
            raise ConfigError(f"{where}: need 1 <= default_max_tokens <= max_tokens_limit")
        if not model.backends:
            raise ConfigError(f"{where}: configure at least one backend")
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
            observed = observable_limits(backend.kind)
            for c in config.scheduling.classes:
                blind = [n for n in SIGNAL_LIMITS if getattr(c, n) and n not in observed]
                if blind:
                    raise ConfigError(
                        f"scheduling.classes[{c.name}] sets {', '.join(blind)}, but {where}.backends"
                        f"[{backend.name}] ({backend.kind}) does not export that signal: the limit would never bind"
                    )


_REPLICA_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_KEY_PREFIX = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def _validate_cluster(cluster: ClusterConfig) -> None:
    """Checked whatever the store, so a file that switches to Redis later is already sound (and never holds a
    password)."""
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


TRACING_PROTOCOLS = ("grpc", "http/protobuf")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")  # an HTTP token


def _validate_tracing(tracing: TracingConfig) -> None:
    """The collector's URL (no credentials in it: a token goes in a header), the transport, the headers."""
    if tracing.protocol not in TRACING_PROTOCOLS:
        raise ConfigError(f"tracing.protocol {tracing.protocol!r}: one of {', '.join(TRACING_PROTOCOLS)}")
    if not 1 <= len(tracing.service_name) <= 128:
        raise ConfigError("tracing.service_name: 1-128 characters")
    for name, value in tracing.headers.items():
        if not _HEADER_NAME.fullmatch(name) or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise ConfigError(f"tracing.headers: {name!r} is not a valid header (name a token, value without controls)")
    if not tracing.endpoint:
        return
    parts = urlsplit(tracing.endpoint)
    if "@" in parts.netloc:
        raise ConfigError(
            "tracing.endpoint must not carry a user or password: send a token in tracing.headers or in "
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"tracing.endpoint {tracing.endpoint!r}: http(s)://host:port, plus /v1/traces for http/protobuf"
        )
    try:
        parts.port  # noqa: B018 (parsing the port is the check)
    except ValueError as exc:
        raise ConfigError(f"tracing.endpoint {tracing.endpoint!r}: {exc}") from exc


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

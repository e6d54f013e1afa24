"""Configuration: every field documented with a default, strict validation, the example config loads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scheduler_svc import config as cfg
from scheduler_svc.app.settings import config_from_dict, load_config
from scheduler_svc.config import ConfigError
from scheduler_svc.policies import scheduling_params

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = [
    cfg.Config,
    cfg.ServerConfig,
    cfg.AuthConfig,
    cfg.SchedulingConfig,
    cfg.PriorityClassConfig,
    cfg.ModelConfig,
    cfg.GateConfig,
    cfg.BackendConfig,
    cfg.ClusterConfig,
]
MINIMAL = {"models": [{"name": "m", "backends": [{"name": "b", "url": "http://127.0.0.1:8000"}]}]}


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.__name__)
def test_every_field_has_a_default_and_a_docstring(section: type) -> None:
    for f in dataclasses.fields(section):
        assert f.metadata.get("doc"), f"{section.__name__}.{f.name} has no doc"
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        assert has_default, f"{section.__name__}.{f.name} has no default"


def test_every_policy_parameter_has_a_default_a_doc_and_its_values() -> None:
    """A policy's own parameters are declared like the schema's fields, at the field."""
    declared = scheduling_params()
    assert {"vtc_lookahead_tokens", "vtc_return_grace_seconds", "idle_user_ttl_seconds"} <= set(declared)
    for key, (names, f) in declared.items():
        assert names, key
        assert f.default is not dataclasses.MISSING and f.metadata["doc"] and f.metadata["bounds"], key


def test_a_policy_parameter_is_read_from_its_table_and_a_typo_is_refused() -> None:
    config = config_from_dict({**MINIMAL, "scheduling": {"fairness": "vtc", "vtc_lookahead_tokens": 64}})
    assert config.scheduling.policy_params == {"vtc_lookahead_tokens": 64}
    with pytest.raises(ConfigError, match=r"scheduling: unknown key\(s\) \['vtc_lookahed_tokens'\]"):
        config_from_dict({**MINIMAL, "scheduling": {"vtc_lookahed_tokens": 64}})
    with pytest.raises(ConfigError, match=r"scheduling\.vtc_return_grace_seconds must be 0 to 1, got 2"):
        config_from_dict({**MINIMAL, "scheduling": {"fairness": "round_robin", "vtc_return_grace_seconds": 2}})
    with pytest.raises(ConfigError, match=r"scheduling\.vtc_lookahead_tokens: expected float"):
        config_from_dict({**MINIMAL, "scheduling": {"vtc_lookahead_tokens": "many"}})


def test_minimal_config_gets_documented_defaults() -> None:
    config = config_from_dict(MINIMAL)
    assert config.models[0].gate.waiting_target == 3
    assert config.scheduling.fairness == "vtc"
    assert config.server.listen == "127.0.0.1:50051"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"modles": []}, "unknown key"),
        (
            {"scheduling": {"fairness": "lottery"}},
            "unknown fairness policy 'lottery'; known: ['round_robin', 'vtc', 'vtc_basic', 'weighted_round_robin']",
        ),
        ({"scheduling": {"default_class": "vip"}}, "default_class 'vip'"),
        ({"scheduling": {"band_policy": "lottery"}}, "unknown band policy 'lottery'; known: ['strict_rank']"),
        ({"models": [{"name": "m", "backends": []}]}, "at least one backend"),
        ({"models": [{"name": "m", "backends": [{"name": "b", "kind": "ollama"}]}]}, "known kinds"),
        ({"models": [{"name": "m", "gate": {"waiting_target": "3"}, "backends": [{"name": "b"}]}]}, "expected int"),
        (
            {"models": [{"name": "m", "gate": {"priority_waiting_target": -1}, "backends": [{"name": "b"}]}]},
            "priority_waiting_target must be >= 0",
        ),
        ({"models": []}, "at least one"),
    ],
)
def test_invalid_configs_are_rejected_with_a_clear_message(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        config_from_dict({**MINIMAL, **change})
    assert message in str(err.value)


def test_bundled_example_configs_load() -> None:
    files = sorted((ROOT / "configs").glob("*.toml"))
    assert files, "configs/*.toml missing"
    for path in files:
        load_config(path)


def test_config_reference_lists_every_field() -> None:
    names = {row[0] for row in cfg.describe_fields()}
    assert "models[].gate.waiting_target" in names and "server.listen" in names


def test_cluster_defaults_to_one_process_in_memory() -> None:
    cluster = config_from_dict(MINIMAL).cluster
    assert cluster.store == "memory" and cluster.heartbeat_timeout_seconds >= 2 * cluster.heartbeat_interval_seconds


@pytest.mark.parametrize(
    "cluster",
    [
        {"store": "redis", "redis_url": "rediss://redis.internal:6380/2", "redis_password_file": "/run/pw"},
        {"store": "redis", "redis_url": "unix:///run/redis.sock?db=1", "redis_password_env": "REDIS_PW"},
        {"redis_username": "svc", "redis_password_env": "REDIS_PW", "replica_name": "r-1.eu_west"},
        {"key_prefix": "team-a:llmsched", "heartbeat_interval_seconds": 1, "heartbeat_timeout_seconds": 2},
        {"degraded_in_flight_cap": 0, "admission_wait_seconds": 0.2, "report_interval_seconds": 0.01},
    ],
)
def test_valid_cluster_sections_load(cluster: dict[str, object]) -> None:
    config_from_dict({**MINIMAL, "cluster": cluster})


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({"store": "etcd"}, "cluster.store must be memory, redis, got 'etcd'"),
        ({"redis_url": "http://127.0.0.1:6379"}, "redis://host:port/db"),
        ({"redis_url": "redis://:hunter2@127.0.0.1:6379/0"}, "must not carry a user or password"),
        ({"redis_url": "redis://svc:hunter2@127.0.0.1:6379/0"}, "redis_password_file"),
        ({"redis_url": "redis://127.0.0.1:6379/0?password=hunter2"}, "must not carry a user or password"),
        ({"redis_url": "redis:///0"}, "names no host"),
        ({"redis_url": "redis://127.0.0.1:port/0"}, "cluster.redis_url"),
        ({"redis_password_file": "/run/pw", "redis_password_env": "PW"}, "not both"),
        ({"redis_username": "svc"}, "redis_username needs a password"),
        ({"replica_name": "r 1"}, "cluster.replica_name"),
        ({"replica_name": "r" * 65}, "cluster.replica_name"),
        ({"key_prefix": ""}, "cluster.key_prefix"),
        ({"key_prefix": "a b"}, "cluster.key_prefix"),
        ({"heartbeat_interval_seconds": 0}, "cluster.heartbeat_interval_seconds must be > 0"),
        ({"heartbeat_interval_seconds": 1.5, "heartbeat_timeout_seconds": 2.0}, ">= 2 x the interval"),
        ({"heartbeat_timeout_seconds": float("inf")}, ">= 2 x the interval"),
        ({"admission_wait_seconds": 0}, "cluster.admission_wait_seconds must be > 0"),
        ({"report_interval_seconds": -1}, "cluster.report_interval_seconds must be > 0"),
        ({"degraded_in_flight_cap": -1}, "cluster.degraded_in_flight_cap must be >= 0"),
        ({"redis_pasword_file": "/run/pw"}, "unknown key"),
    ],
)
def test_invalid_cluster_sections_are_rejected(cluster: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({**MINIMAL, "cluster": cluster})
    assert message in str(err.value)


@pytest.mark.parametrize("url", ["redis://svc:hunter2@127.0.0.1:6379/0", "http://:hunter2@127.0.0.1:port/0"])
def test_a_password_in_the_redis_url_is_never_echoed(url: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({**MINIMAL, "cluster": {"redis_url": url}})
    assert "hunter2" not in str(err.value)


def test_config_reference_lists_the_cluster_fields() -> None:
    names = {row[0] for row in cfg.describe_fields()}
    expected = {f"cluster.{f.name}" for f in dataclasses.fields(cfg.ClusterConfig)}
    assert expected <= names


def test_the_event_loop_is_one_the_service_can_run() -> None:
    assert config_from_dict(MINIMAL).server.event_loop == "uvloop"
    assert config_from_dict({**MINIMAL, "server": {"event_loop": "asyncio"}}).server.event_loop == "asyncio"
    with pytest.raises(ConfigError, match=r"server\.event_loop 'trio': one of uvloop, asyncio"):
        config_from_dict({**MINIMAL, "server": {"event_loop": "trio"}})


@pytest.mark.parametrize("interval", [0.0, 0.005, 0.05, 1.0])
def test_the_stream_read_interval_is_off_or_a_grid_worth_its_timers(interval: float) -> None:
    config = config_from_dict({**MINIMAL, "server": {"stream_read_interval_seconds": interval}})
    assert config.server.stream_read_interval_seconds == interval


@pytest.mark.parametrize("interval", [-0.01, 0.0001, 1.5])
def test_a_stream_read_interval_outside_its_range_is_a_config_error(interval: float) -> None:
    with pytest.raises(ConfigError, match=r"server\.stream_read_interval_seconds"):
        config_from_dict({**MINIMAL, "server": {"stream_read_interval_seconds": interval}})
    with pytest.raises(ConfigError, match=r"server\.stream_read_after_tokens"):
        config_from_dict({**MINIMAL, "server": {"stream_read_after_tokens": -1}})

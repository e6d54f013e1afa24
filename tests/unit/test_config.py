"""Configuration: every field documented with a default, strict validation, the example config loads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scheduler_svc import config as cfg
from scheduler_svc.config import ConfigError, config_from_dict, load_config

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
]
MINIMAL = {"models": [{"name": "m", "backends": [{"name": "b", "url": "http://127.0.0.1:8000"}]}]}


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.__name__)
def test_every_field_has_a_default_and_a_docstring(section: type) -> None:
    for f in dataclasses.fields(section):
        assert f.metadata.get("doc"), f"{section.__name__}.{f.name} has no doc"
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        assert has_default, f"{section.__name__}.{f.name} has no default"


def test_minimal_config_gets_documented_defaults() -> None:
    config = config_from_dict(MINIMAL)
    assert config.models[0].gate.waiting_target == 3
    assert config.scheduling.fairness == "round_robin"
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

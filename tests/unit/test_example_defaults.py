"""configs/example.toml and the schema's defaults agree: every value the example sets is the default, but for
the few that tie it to a place (the model's and backend's names, the HTTP door `make run` serves), so a
config that leaves a field out gets what the example recommends.

`scripts/gen_docs.py --check` holds the example to show every field; this holds the values it sets."""

from __future__ import annotations

import dataclasses
from typing import Any

from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.config import BackendConfig, Config, ModelConfig
from scheduler_svc.policies import scheduling_params
from tests.helpers import example_config

# (dotted path, with list items by index) -> why the example sets its own value
PLACE = {
    "server.http_listen": "make run serves the HTTP door; the service opens no port it was not asked for",
    "models[0].name": "the model make run's simulator serves",
    "models[0].backends[0].name": "a name for make run's simulator",
}


def differences(actual: Any, default: Any, path: str = "") -> list[str]:
    """Where two configuration values differ, field by field, as `path: example X, default Y`."""
    if dataclasses.is_dataclass(actual) and type(actual) is type(default):
        found = []
        for f in dataclasses.fields(actual):
            found += differences(getattr(actual, f.name), getattr(default, f.name), f"{path}.{f.name}".lstrip("."))
        return found
    if isinstance(actual, list) and isinstance(default, list) and len(actual) == len(default):
        return [
            line
            for i, (a, d) in enumerate(zip(actual, default, strict=True))
            for line in differences(a, d, f"{path}[{i}]")
        ]
    return [] if actual == default else [f"{path}: example {actual!r}, default {default!r}"]


def _example() -> Config:
    return config_from_dict(example_config())


def _defaults_shaped_like(example: Config) -> Config:
    """The defaults, with as many models and backends as the example (a config needs them), each default."""
    models = [ModelConfig(backends=[BackendConfig() for _ in m.backends]) for m in example.models]
    return Config(models=models)


def _differing(example: Config) -> dict[str, str]:
    """Path -> the difference, for every field the example sets to other than its default (the policies'
    parameters apart: they are checked against their own declarations)."""
    found = differences(example, _defaults_shaped_like(example))
    return {line.split(":")[0]: line for line in found if not line.startswith("scheduling.policy_params:")}


def test_every_value_the_example_sets_is_the_default_but_where_it_is_placed() -> None:
    differing = _differing(_example())
    unexpected = [line for path, line in differing.items() if path not in PLACE]
    assert unexpected == [], "set them to the default (schema or example), or say in PLACE why they differ"
    needless = sorted(set(PLACE) - set(differing))
    assert needless == [], "the example sets the default there: drop it from PLACE"


def test_the_policies_parameters_the_example_sets_are_their_defaults() -> None:
    declared = scheduling_params()
    shown = _example().scheduling.policy_params
    assert shown, "the example shows the chosen fairness policy's parameters"
    for key, value in shown.items():
        field = declared[key][1]
        assert value == field.default, f"scheduling.{key}: example {value!r}, default {field.default!r}"


def test_a_difference_is_found_where_it_is() -> None:
    example = _example()
    classes = list(example.scheduling.classes)
    classes[2] = dataclasses.replace(classes[2], max_engine_running=6)
    changed = dataclasses.replace(
        example, scheduling=dataclasses.replace(example.scheduling, fairness="round_robin", classes=classes)
    )
    differing = _differing(changed)
    assert differing["scheduling.fairness"] == "scheduling.fairness: example 'round_robin', default 'vtc'"
    assert "scheduling.classes[2].max_engine_running" in differing

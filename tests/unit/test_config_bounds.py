"""The values docs/configuration.md shows for each field (`bounds` in `scheduler_svc.config.schema`) are the
values the loader accepts: for every numeric bound (">= N", "> N", "A to B", "0, or A to B"), the example
config with the field set just outside it is refused with an error naming the field, and set at its edge
is accepted. A bound in words (a pattern, "at least one") is enforced by the loader's own tests."""

from __future__ import annotations

import copy
import dataclasses
import re
import typing
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.config import Config, ConfigError
from scheduler_svc.policies import scheduling_params
from tests.helpers import example_config

NUMBER = r"-?[0-9.]+"


def _bounded_fields(cls: type[Any] = Config, prefix: str = "") -> Iterator[tuple[str, type[Any], str]]:
    """(dotted path, the field's type, its bounds) for every field with bounds, recursively."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else hint
        if isinstance(item, type) and dataclasses.is_dataclass(item):
            yield from _bounded_fields(item, f"{prefix}{f.name}.")
        elif f.metadata.get("bounds") and hint in (int, float):
            yield f"{prefix}{f.name}", hint, f.metadata["bounds"]


def cases(path: str, kind: type[Any], bounds: str) -> list[tuple[float, bool]]:
    """(a value, whether the loader must accept it) around the edges of `bounds`."""
    step = 1 if kind is int else 0.001
    if m := re.fullmatch(rf">= ({NUMBER})", bounds):
        edge = float(m.group(1))
        return [(edge, True), (edge - step, False)]
    if m := re.fullmatch(rf"> ({NUMBER})", bounds):
        edge = float(m.group(1))
        return [(edge + step, True), (edge, False)]
    if m := re.fullmatch(rf"({NUMBER}) to ({NUMBER})", bounds):
        low, high = float(m.group(1)), float(m.group(2))
        return [(low, True), (high, True), (low - step, False), (high + step, False)]
    if m := re.fullmatch(rf"0, or ({NUMBER}) to ({NUMBER})", bounds):
        low, high = float(m.group(1)), float(m.group(2))
        return [(0, True), (low, True), (high, True), (low - step, False), (high + step, False)]
    return []  # in words: not a numeric range


# where a field lives in the example config's dict
CONTAINERS = {
    "server": lambda c: c["server"],
    "scheduling": lambda c: c["scheduling"],
    "scheduling.weights": lambda c: c["scheduling"]["weights"],
    "scheduling.classes": lambda c: c["scheduling"]["classes"][0],
    "models": lambda c: c["models"][0],
    "models.gate": lambda c: c["models"][0]["gate"],
    "models.locality": lambda c: c["models"][0]["locality"],
    "models.backends": lambda c: c["models"][0]["backends"][0],
    "cluster": lambda c: c["cluster"],
    "tracing": lambda c: c["tracing"],
}


def _policy_parameters() -> Iterator[tuple[str, type[Any], str]]:
    """The same for the parameters the registered policies read from [scheduling]."""
    kinds: dict[Any, type[Any]] = {"float": float, "int": int, float: float, int: int}
    for key, (_, f) in scheduling_params().items():
        if f.metadata.get("bounds") and f.type in kinds:
            yield f"scheduling.{key}", kinds[f.type], f.metadata["bounds"]


NUMERIC = [
    (path, kind, bounds, value, ok)
    for path, kind, bounds in [*_bounded_fields(), *_policy_parameters()]
    for value, ok in cases(path, kind, bounds)
]


def test_the_numeric_bounds_are_many() -> None:
    """The parsing above still understands the schema's bounds (a changed wording would silently skip them)."""
    assert len({path for path, *_ in NUMERIC}) >= 40


@pytest.mark.parametrize(
    ("path", "kind", "bounds", "value", "ok"),
    NUMERIC,
    ids=[f"{path}={value:g}:{'ok' if ok else 'refused'}" for path, _, _, value, ok in NUMERIC],
)
def test_the_loader_accepts_exactly_the_documented_values(
    path: str, kind: type[Any], bounds: str, value: float, ok: bool
) -> None:
    section, _, key = path.rpartition(".")
    config = copy.deepcopy(example_config())
    config.setdefault("cluster", {})
    config["scheduling"].setdefault("weights", {})
    CONTAINERS[section](config)[key] = kind(value) if kind is int else value
    if key == "max_tokens_limit":
        CONTAINERS[section](config)["default_max_tokens"] = 1
    if ok:
        config_from_dict(config)
    else:
        with pytest.raises(ConfigError, match=re.escape(key)):
            config_from_dict(config)

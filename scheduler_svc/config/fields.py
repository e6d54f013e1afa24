"""How a configuration field is declared, built from TOML and checked: everything about a field sits at the
field.

A field is declared with `setting(default, doc, bounds)`: its default, a one-line doc, and the values it
accepts as docs/configuration.md shows them. The simple forms of `bounds` are checked here for every field
of every section (`check_bounds`), so no central validator has to be kept in step with the fields:

    ">= 1", "> 0"          a number at least / above the bound
    "0 to 1"               a number within the range (NaN and infinities are refused)
    "0, or 0.005 to 1"     0 (off), or within the range
    "values > 0"           every value of a table of numbers above the bound
    "model, global"        one of the names

A bound in words (a pattern, "at least one", one field against another) is checked by whoever owns the
rule: the loader (`scheduler_svc.app.settings`) or the policy the field belongs to.

`build(cls, raw, where)` turns a parsed TOML table into the section's dataclass (unknown keys and wrong
types are errors naming where). A section may collect the keys that are none of its fields in a field
declared with `extra_keys(doc)`: the parameters of the policies configured there, which each policy
builds and checks itself from the same declarations.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """The configuration file is invalid; the message says where and why."""


def setting(default: Any, doc: str, bounds: str = "") -> Any:
    """A dataclass field with its default, a docstring and the values it accepts (`bounds`), kept in its
    metadata."""
    metadata = {"doc": doc, "bounds": bounds}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def extra_keys(doc: str) -> Any:
    """A field that holds the table's keys that are none of its other fields (raw TOML values)."""
    return dataclasses.field(default_factory=dict, metadata={"doc": doc, "bounds": "", "extra": True})


def is_extra(field: dataclasses.Field[Any]) -> bool:
    return bool(field.metadata.get("extra"))


# -- bounds ---------------------------------------------------------------------------------------------------
_NUMBER = r"-?[0-9.]+"
_AT_LEAST = re.compile(rf">= ({_NUMBER})")
_ABOVE = re.compile(rf"> ({_NUMBER})")
_RANGE = re.compile(rf"({_NUMBER}) to ({_NUMBER})")
_OFF_OR_RANGE = re.compile(rf"0, or ({_NUMBER}) to ({_NUMBER})")
_VALUES = re.compile(r"values (.+)")
_NAMES = re.compile(r"[a-z_]+(?:, [a-z_]+)+")


def accepts(bounds: str) -> Callable[[Any], bool] | None:
    """What a value must satisfy to be within `bounds` (one of the simple forms above); None for a bound in
    words, which its owner checks."""
    if m := _AT_LEAST.fullmatch(bounds):
        low = float(m.group(1))
        return lambda v: _number(v) and v >= low
    if m := _ABOVE.fullmatch(bounds):
        low = float(m.group(1))
        return lambda v: _number(v) and v > low
    if m := _OFF_OR_RANGE.fullmatch(bounds):
        low, high = float(m.group(1)), float(m.group(2))
        return lambda v: v == 0 or (_number(v) and low <= v <= high)
    if m := _RANGE.fullmatch(bounds):
        low, high = float(m.group(1)), float(m.group(2))
        return lambda v: _number(v) and low <= v <= high
    if m := _VALUES.fullmatch(bounds):
        each = accepts(m.group(1))
        if each is None:
            return None
        return lambda v: isinstance(v, Mapping) and all(each(item) for item in v.values())
    if _NAMES.fullmatch(bounds):
        names = bounds.split(", ")
        return lambda v: v in names
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def check_bounds(section: Any, where: str = "") -> None:
    """Raise ConfigError for the first field of `section` (recursively, lists of sections included) whose
    value is outside its simple bounds; `where` is the section's dotted path with a trailing dot."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            check_bounds(value, f"{where}{f.name}.")
        elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            for i, item in enumerate(value):
                label = getattr(item, "name", "") or str(i)
                check_bounds(item, f"{where}{f.name}[{label}].")
        elif (bounds := f.metadata.get("bounds", "")) and (ok := accepts(bounds)) is not None and not ok(value):
            raise ConfigError(f"{where}{f.name} must be {bounds}, got {value!r}")


# -- building from TOML ---------------------------------------------------------------------------------------
def build(cls: type[T], raw: Any, where: str = "") -> T:
    """The dataclass `cls` from a parsed TOML table; unknown keys (unless the section collects them) and
    wrong types are errors saying where (`where`: the table's dotted path with a trailing dot)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where.rstrip('.') or 'top level'}: expected a table, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    extra = next((f.name for f in fields.values() if is_extra(f)), None)
    known = {name for name, f in fields.items() if not is_extra(f)}
    unknown = sorted(set(raw) - known)
    if unknown and extra is None:
        raise ConfigError(f"{where.rstrip('.') or 'top level'}: unknown key(s) {unknown}; known: {sorted(known)}")
    hints = typing.get_type_hints(cls)
    values = {name: _convert(hints[name], raw[name], f"{where}{name}") for name in raw if name in known}
    if extra is not None:
        values[extra] = {name: raw[name] for name in unknown}
    return cls(**values)


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return build(hint, value, where + ".")  # type: ignore[arg-type]
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

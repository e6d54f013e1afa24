"""Command-line flags for `llmsched sim`, generated from `SimConfig` so they cannot drift from it.

Every field `some_name` becomes `--some-name` with the field's description as help; Literal fields get
their choices. `--served-model-name` is accepted as vLLM's spelling of `--model-name`.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

from backends.sim.config import SimConfig

_ALIASES = {"model_name": ("--served-model-name",)}


def add_cli_arguments(parser: argparse.ArgumentParser, *, include_listen: bool = True) -> None:
    """Add one flag per `SimConfig` field, plus `--host` and `--port` unless `include_listen` is False."""
    if include_listen:
        parser.add_argument("--host", default="127.0.0.1", help="Address to listen on (default: %(default)s).")
        parser.add_argument(
            "--port", type=int, default=8000, help="Port to listen on; 0 picks a free one (default: %(default)s)."
        )
    hints = typing.get_type_hints(SimConfig)
    for field in dataclasses.fields(SimConfig):
        flag = "--" + field.name.replace("_", "-")
        kwargs: dict[str, Any] = {
            "dest": field.name,
            "default": field.default,
            "help": f"{field.metadata['doc']} (default: %(default)s)",
        }
        kwargs.update(_argparse_type(hints[field.name]))
        parser.add_argument(flag, *_ALIASES.get(field.name, ()), **kwargs)


def config_from_args(ns: argparse.Namespace) -> SimConfig:
    """Build the config from parsed flags; fields missing from `ns` keep their defaults."""
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(SimConfig) if hasattr(ns, f.name)}
    return SimConfig(**values)


def _argparse_type(hint: Any) -> dict[str, Any]:
    """`type` / `choices` for a field's annotation."""
    if typing.get_origin(hint) is typing.Literal:
        return {"choices": typing.get_args(hint)}
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) == 1:
            return {"type": _optional(inner[0]), "metavar": inner[0].__name__.upper()}
    if hint in (int, float, str):
        return {"type": hint}
    raise TypeError(f"no CLI mapping for config type {hint!r}")  # pragma: no cover


def _optional(convert: type) -> Any:
    """A converter that also accepts "none" for a field whose default is None."""

    def parse(text: str) -> Any:
        return None if text.lower() == "none" else convert(text)

    parse.__name__ = convert.__name__
    return parse

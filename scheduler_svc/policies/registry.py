"""Policies are chosen by name from the config through one explicit registry per kind.

A policy may declare its parameters: a frozen dataclass of `config.setting` fields (default, values, doc at
the field), read from the keys of the table that names the policy. The registry builds them for the chosen
policy, so each policy parses and checks its own parameters; `declared` lists them for the loader and the
docs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from scheduler_svc.config import ConfigError, build, check_bounds

P = TypeVar("P")


class Registry(Generic[P]):
    """Maps config names to policy factories; an unknown name is a config error listing the known ones."""

    def __init__(self, kind: str, table: str = "") -> None:
        self.kind = kind
        self.table = table  # where the policies of this kind read their parameters ("scheduling")
        self._factories: dict[str, Callable[..., P]] = {}
        self._docs: dict[str, str] = {}
        self._params: dict[str, type[Any]] = {}

    def register(self, name: str, factory: Callable[..., P], doc: str, *, params: type[Any] | None = None) -> None:
        """Make `factory` available as `name`; with `params`, it is called with them first."""
        if name in self._factories:
            raise ValueError(f"{self.kind} policy {name!r} registered twice")
        self._factories[name] = factory
        self._docs[name] = doc
        if params is not None:
            self._params[name] = params

    def unregister(self, name: str) -> None:
        """Forget `name` (a test that registered a policy of its own cleans up)."""
        self._factories.pop(name)
        self._docs.pop(name)
        self._params.pop(name, None)

    def check(self, name: str, where: str) -> None:
        """Raise ConfigError unless `name` is registered."""
        if name not in self._factories:
            raise ConfigError(f"{where}: unknown {self.kind} policy {name!r}; known: {sorted(self._factories)}")

    def params(self, name: str, raw: Mapping[str, Any]) -> Any:
        """The parameters policy `name` declares, built from the keys of `raw` that are its own and checked
        against their bounds; None when it declares none."""
        cls = self._params.get(name)
        if cls is None:
            return None
        own = {f.name for f in dataclasses.fields(cls)}
        where = f"{self.table}." if self.table else ""
        params = build(cls, {key: value for key, value in raw.items() if key in own}, where)
        check_bounds(params, where)
        return params

    def create(self, name: str, *args: object, params: Mapping[str, Any] | None = None) -> P:
        """Build a fresh policy instance (with its parameters built from `params` when it declares any)."""
        self.check(name, self.kind)
        if name in self._params:
            return self._factories[name](self.params(name, params or {}), *args)
        return self._factories[name](*args)

    def factory(self, name: str) -> Callable[..., P] | None:
        """What `name` builds (None when unknown), for checks that read a policy's declared traits."""
        return self._factories.get(name)

    def declared(self) -> dict[str, tuple[list[str], dataclasses.Field[Any]]]:
        """Every parameter a policy of this kind declares: key -> (the policies that read it, its field)."""
        found: dict[str, tuple[list[str], dataclasses.Field[Any]]] = {}
        for name, cls in sorted(self._params.items()):
            for f in dataclasses.fields(cls):
                found.setdefault(f.name, ([], f))[0].append(name)
        return found

    def describe(self) -> dict[str, str]:
        """Name -> one-line description, for `llmsched policies`."""
        return dict(self._docs)

"""Policies are chosen by name from the config through one explicit registry per kind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from scheduler_svc.config import ConfigError

P = TypeVar("P")


class Registry(Generic[P]):
    """Maps config names to policy factories; an unknown name is a config error listing the known ones."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., P]] = {}
        self._docs: dict[str, str] = {}

    def register(self, name: str, factory: Callable[..., P], doc: str) -> None:
        """Make `factory` available as `name`."""
        if name in self._factories:
            raise ValueError(f"{self.kind} policy {name!r} registered twice")
        self._factories[name] = factory
        self._docs[name] = doc

    def check(self, name: str, where: str) -> None:
        """Raise ConfigError unless `name` is registered."""
        if name not in self._factories:
            raise ConfigError(f"{where}: unknown {self.kind} policy {name!r}; known: {sorted(self._factories)}")

    def create(self, name: str, *args: object) -> P:
        """Build a fresh policy instance."""
        self.check(name, self.kind)
        return self._factories[name](*args)

    def factory(self, name: str) -> Callable[..., P] | None:
        """What `name` builds (None when unknown), for checks that read a policy's declared traits."""
        return self._factories.get(name)

    def describe(self) -> dict[str, str]:
        """Name -> one-line description, for `llmsched policies`."""
        return dict(self._docs)

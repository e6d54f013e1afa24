"""The one list of engine kinds, and the factory that builds an adapter for a configured kind.

An adapter module is imported only when something asks for its kind (a config names it), so importing
the scheduler's core loads neither aiohttp nor any adapter. Config validation reads a kind's
`BackendCapabilities` from here, which imports that kind's adapter and nothing else.
To add an engine: write `backends/adapters/<kind>.py` (an `HttpAdapter` subclass) and add one line below.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from backends.base import Backend, BackendCapabilities, BackendSpec

# kind -> "module:class" of its adapter, imported on first use
_ADAPTERS: dict[str, str] = {
    "vllm": "backends.adapters.vllm:VllmBackend",
    "tgi": "backends.adapters.tgi:TgiBackend",
    "llamacpp": "backends.adapters.llamacpp:LlamaCppBackend",
}
BACKEND_KINDS: tuple[str, ...] = tuple(_ADAPTERS)


class AdapterClass(Protocol):
    """What the registry needs of an adapter class: its class-level capabilities and its constructor."""

    CAPABILITIES: BackendCapabilities

    def __call__(self, spec: BackendSpec) -> Backend: ...


def adapter_class(kind: str) -> AdapterClass:
    """The adapter class for `kind`, its module imported now; ValueError for an unknown kind."""
    try:
        module_name, _, class_name = _ADAPTERS[kind].partition(":")
    except KeyError:
        raise ValueError(f"unknown backend kind {kind!r}; known: {sorted(_ADAPTERS)}") from None
    cls: AdapterClass = getattr(importlib.import_module(module_name), class_name)
    return cls


def capabilities(kind: str) -> BackendCapabilities:
    """What an engine of `kind` can do and which load signals it exposes (before any is configured with
    priority scheduling)."""
    return adapter_class(kind).CAPABILITIES


def create_backend(kind: str, spec: BackendSpec) -> Backend:
    """Build the adapter for an engine kind ("vllm", "tgi", "llamacpp")."""
    return adapter_class(kind)(spec)

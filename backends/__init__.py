"""Engine adapters behind one Protocol (`Backend`), one module per engine."""

from __future__ import annotations

from backends._http import HttpSettings
from backends.base import (
    Accepted,
    Backend,
    BackendCapabilities,
    BackendLoad,
    ChatMessage,
    Finished,
    GenerationEvent,
    GenerationRequest,
    SamplingParams,
    TextDelta,
)
from backends.errors import (
    BackendError,
    BackendOverloaded,
    BackendProtocolError,
    BackendRejectedRequest,
    BackendUnavailable,
)
from backends.llamacpp import LlamaCppBackend
from backends.tgi import TgiBackend
from backends.vllm import VllmBackend

ADAPTERS: dict[str, type[VllmBackend] | type[TgiBackend] | type[LlamaCppBackend]] = {
    "vllm": VllmBackend,
    "tgi": TgiBackend,
    "llamacpp": LlamaCppBackend,
}


def create_backend(
    *,
    kind: str,
    name: str,
    url: str,
    engine_model: str,
    priority_scheduling: bool = False,
    http: HttpSettings | None = None,
) -> Backend:
    """Build the adapter for an engine kind ("vllm", "tgi", "llamacpp")."""
    try:
        adapter = ADAPTERS[kind]
    except KeyError:
        raise ValueError(f"unknown backend kind {kind!r}; known: {sorted(ADAPTERS)}") from None
    return adapter(name=name, url=url, engine_model=engine_model, http=http, priority_scheduling=priority_scheduling)


__all__ = [
    "ADAPTERS",
    "Accepted",
    "Backend",
    "BackendCapabilities",
    "BackendError",
    "BackendLoad",
    "BackendOverloaded",
    "BackendProtocolError",
    "BackendRejectedRequest",
    "BackendUnavailable",
    "ChatMessage",
    "Finished",
    "GenerationEvent",
    "GenerationRequest",
    "HttpSettings",
    "LlamaCppBackend",
    "SamplingParams",
    "TextDelta",
    "TgiBackend",
    "VllmBackend",
    "create_backend",
]

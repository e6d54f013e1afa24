"""The backend port: the `Backend` Protocol, its neutral errors, and the registry of engine kinds.

Importing this package loads no adapter (nor aiohttp): `backends.registry` imports an adapter module only
when a configured backend names its kind. Adapters themselves live in `backends.adapters.vllm`, `backends.adapters.tgi`,
`backends.adapters.llamacpp` (and `backends.fake` for tests); the simulator in `backends.sim` stands apart.
"""

from __future__ import annotations

from backends.base import (
    Accepted,
    Backend,
    BackendCapabilities,
    BackendLoad,
    BackendSpec,
    ChatMessage,
    Finished,
    GenerationEvent,
    GenerationRequest,
    HttpSettings,
    SamplingChoices,
    SamplingParams,
    TextDelta,
    TraceContext,
)
from backends.errors import (
    BackendError,
    BackendOverloaded,
    BackendProtocolError,
    BackendRejectedRequest,
    BackendUnavailable,
)
from backends.registry import BACKEND_KINDS, adapter_class, capabilities, create_backend

__all__ = [
    "BACKEND_KINDS",
    "Accepted",
    "Backend",
    "BackendCapabilities",
    "BackendError",
    "BackendLoad",
    "BackendOverloaded",
    "BackendProtocolError",
    "BackendRejectedRequest",
    "BackendSpec",
    "BackendUnavailable",
    "ChatMessage",
    "Finished",
    "GenerationEvent",
    "GenerationRequest",
    "HttpSettings",
    "SamplingChoices",
    "SamplingParams",
    "TextDelta",
    "TraceContext",
    "adapter_class",
    "capabilities",
    "create_backend",
]

"""A backend for tests that calls a handler function instead of an engine (like httpx.MockTransport)."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable

from backends.base import BackendCapabilities, BackendLoad, GenerationEvent, GenerationRequest

GenerateHandler = Callable[[GenerationRequest], AsyncGenerator[GenerationEvent, None]]
LoadHandler = Callable[[], BackendLoad]


def idle_load() -> BackendLoad:
    """An empty engine, read just now."""
    return BackendLoad(ok=True, read_at=time.monotonic(), waiting=0, running=0)


class FakeBackend:
    """Delegates `generate` and `load` to plain functions and records what it was asked."""

    def __init__(
        self,
        generate: GenerateHandler,
        load: LoadHandler = idle_load,
        *,
        name: str = "fake",
        capabilities: BackendCapabilities | None = None,
    ) -> None:
        self._generate = generate
        self._load = load
        self._name = name
        self._capabilities = capabilities or BackendCapabilities()
        self.requests: list[GenerationRequest] = []
        self.closed = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def capabilities(self) -> BackendCapabilities:
        return self._capabilities

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        self.requests.append(request)
        return self._generate(request)

    async def load(self) -> BackendLoad:
        return self._load()

    async def aclose(self) -> None:
        self.closed = True

"""The one contract every engine adapter follows.

An adapter turns an engine's HTTP API into a stream of `GenerationEvent`s and the engine's own Prometheus
metrics into one `BackendLoad` snapshot. Metric names and wire formats live in the adapter modules and
nowhere else; the scheduler only ever sees the types defined here.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a chat conversation."""

    role: str
    content: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingChoices:
    """The sampling settings a client may choose, passed through to the engine unchanged (None: the
    engine's default). A client's request (`scheduler_svc.core.request.ClientRequest`) carries them as its
    own fields, and so does the `SamplingParams` an engine gets."""

    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


@dataclass(frozen=True, slots=True)
class SamplingParams(SamplingChoices):
    """Sampling settings passed through to the engine unchanged: the client's choices and how many tokens
    to generate at the most."""

    max_tokens: int = 256


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A W3C Trace Context, validated and in its version-00 form, sent with the engine request as the
    `traceparent` (and `tracestate`, when not empty) headers, so the engine's own spans (vLLM exports them)
    continue the caller's trace. It says nothing else: no adapter reads it for anything but those headers."""

    traceparent: str
    tracestate: str = ""


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What the scheduler asks an engine to generate.

    Exactly one of `prompt` and `messages` is set. There is no model field: an adapter is built for one
    engine model and always asks for it. `engine_priority` is only sent by adapters configured for an
    engine with priority scheduling; for vLLM a lower value is served earlier.
    """

    request_id: str
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    engine_priority: int | None = None
    # How much later than generated a token may reach the client (0: at once). An engine that can send
    # its streamed tokens in groups (vLLM's `stream_interval`) is asked to, within this: fewer chunks to
    # write for its front end and to read for the scheduler. The first token always goes at once.
    max_token_delay: float = 0.0
    trace: TraceContext | None = None  # the trace the engine request continues (None: none)


@dataclass(frozen=True, slots=True)
class Accepted:
    """The engine took the request (its HTTP response started): from now on its metrics can show it."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A chunk of generated text; `tokens` is how many tokens it carries (usually 1). `last`: the engine
    has already said the answer is finished (no more text follows, only the end of the stream)."""

    text: str
    tokens: int = 1
    last: bool = False


@dataclass(frozen=True, slots=True)
class Finished:
    """The last event of a successful generation."""

    finish_reason: str
    prompt_tokens: int | None
    completion_tokens: int


GenerationEvent = Accepted | TextDelta | Finished


@dataclass(frozen=True, slots=True)
class BackendLoad:
    """One reading of an engine's load, taken from its own metrics endpoint.

    `read_at` is a `time.monotonic()` value taken just before the scrape was sent, so that anything the
    scheduler dispatched after it is known not to be reflected in the numbers (the scheduler's scrape loop
    restamps it with its own injected clock, see `scheduler_svc.dispatch.load.scrape`). `ok` is False when the
    endpoint could not be read or parsed; the numbers are then meaningless.
    """

    ok: bool
    read_at: float
    waiting: int = 0
    running: int = 0
    tpot_seconds: float | None = None
    kv_cache_usage: float | None = None
    error: str | None = None
    cache_tokens: int | None = None  # tokens the engine's KV cache holds (None: not exported)


@dataclass(frozen=True, slots=True)
class BackendCapabilities:
    """What an engine can do and which load signals it exposes."""

    supports_priority: bool = False
    has_tpot: bool = False
    has_kv_usage: bool = False


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """Connection settings shared by all HTTP adapters (part of a `BackendSpec`)."""

    metrics_path: str = "/metrics"
    metrics_timeout: float = 1.0
    connect_timeout: float = 5.0
    max_connections: int = 1024
    idle_connection_seconds: float = 2.0  # under the engine's keep-alive (vLLM, uvicorn: 5 s); see HttpEngine


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """Which engine an adapter talks to, and how: what every adapter's constructor takes (given to
    `backends.registry.create_backend`). `priority_scheduling` is honoured only by an adapter whose engine
    supports it."""

    name: str  # the backend's configured name, unique within a model
    url: str  # the engine's base URL
    engine_model: str  # the model name the engine serves (every request asks for it)
    http: HttpSettings = field(default_factory=HttpSettings)
    priority_scheduling: bool = False


@runtime_checkable
class Backend(Protocol):
    """An inference engine reached over HTTP."""

    @property
    def name(self) -> str:
        """The backend's configured name, unique within a model."""
        ...

    @property
    def capabilities(self) -> BackendCapabilities:
        """Static facts about the engine."""
        ...

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        """Stream one generation. Closing the iterator early aborts the request inside the engine.

        Events: `Accepted` once the engine has the request, then `TextDelta`s, then `Finished` (always
        last on success). Raises `backends.errors.BackendError` subclasses.
        """
        ...

    async def load(self) -> BackendLoad:
        """Scrape the engine's metrics once. Never raises for an unreachable endpoint: returns ok=False."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...

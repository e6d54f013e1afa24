"""A client's request as a door hands it in, and the admitted request it becomes."""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.base import ChatMessage, SamplingChoices, SamplingParams, TraceContext


@dataclass(frozen=True, slots=True)
class ClientRequest(SamplingChoices):
    """What a client asks for, as either door (gRPC, the OpenAI-compatible HTTP door) hands it to admission:
    plain values, nothing checked yet (`admission.build_request` validates it for the caller's user). An
    optional value the client left unset is None, so admission can apply the model's default. The sampling
    choices (`SamplingChoices`, keyword-only) are its own fields, as the engine gets them.
    """

    model: str
    prompt: str = ""
    messages: tuple[ChatMessage, ...] = ()
    max_tokens: int | None = None
    priority_class: str = ""  # empty: the configured default class
    request_id: str = ""  # the client's own id (a label scoped to its user); empty: none
    prompt_cache_key: str = ""
    trace_context: TraceContext | None = None  # the caller's valid W3C trace context (`core.trace_context`)
    end_user: str = ""  # the caller's end user (OpenAI `user`, `x-end-user-id`); empty: none named


@dataclass(slots=True, eq=False)
class QueuedRequest:
    """A validated request with its caller's identity, as it sits in a queue.

    Times are `time.monotonic()` values of the scheduler's clock. `deadline` is when it expires in the
    queue (the earlier of the call's deadline and the class's queue TTL), None when neither is set.

    `request_id` is made by the server and unique: every queue, load estimator and policy keys on it, and the engine
    sees it. The client's own `client_request_id` is only a label, scoped to its user (two users may use
    the same one), so no client can collide with another request's state.
    """

    request_id: str
    model: str
    user: str
    priority_class: str
    prompt: str | None
    messages: tuple[ChatMessage, ...] | None
    params: SamplingParams
    admitted_at: float
    deadline: float | None = None
    prompt_chars: int = field(default=0)
    prompt_bytes: int = field(default=0)
    client_request_id: str = ""
    cache_key: str = ""  # the client's prompt_cache_key: kept for prefix-locality scheduling
    # The end user the caller (the tenant, `user`) serves this request for: a sub-flow inside the tenant's
    # fair share, served fairly among the tenant's end users (`core.queues.Flow`). Empty: the tenant's own.
    end_user: str = ""
    # The caller's trace context: the engine request continues it while tracing is off (with tracing on, the
    # request's own spans continue it and the engine gets theirs). Only tracing reads it.
    trace_context: TraceContext | None = None
    # Held by a cluster leader for the replica that serves the call: that replica counts the request's
    # per-request metrics (admitted, waits, TTFT, tokens, cost, outcome), so a sum over replicas counts it once.
    mirrored: bool = False

    @property
    def public_id(self) -> str:
        """The id clients see: theirs when they gave one, else the server-made one."""
        return self.client_request_id or self.request_id

    @property
    def prompt_tokens_estimate(self) -> int:
        """A rough prompt length in tokens (4 characters a token) until the engine reports the truth."""
        return max(1, self.prompt_chars // 4)

    @property
    def max_tokens(self) -> int:
        """The most tokens this request may generate."""
        return self.params.max_tokens

"""Admission rules: a client's request (`ClientRequest`, built by whichever door it came through) becomes a
validated `QueuedRequest` for its user, or a clear error. Both doors share these rules and limits, so a
request means the same whichever door it came through (the path that queues it: `dispatch.intake`)."""

from __future__ import annotations

import functools
import math
import re
import sys
import uuid

from backends.base import ChatMessage, SamplingParams
from scheduler_svc.config import Config, ModelConfig
from scheduler_svc.core.errors import DeadlineExceeded, InvalidField, ModelNotFound, PromptTooLarge
from scheduler_svc.core.identity import user_id_problem
from scheduler_svc.core.request import ClientRequest, QueuedRequest
from scheduler_svc.core.text import client_text

ROLES = ("system", "user", "assistant", "tool")
MAX_STOP_STRINGS = 16
MAX_CACHE_KEY_CHARS = 256
MAX_MESSAGES = 4096  # bounds the wire overhead beyond the counted bytes (a few bytes of framing each)
END_USER_FIELD = "end_user"
"""How a refusal names the end user (the OpenAI `user` field, or the `x-end-user-id` header or metadata)."""
END_USER_HEADER = "x-end-user-id"
"""The gRPC metadata and HTTP header that name the end user a caller sends a request for."""
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/-]{1,128}$")


def agreed_end_user(in_request: str, in_header: str, *, field: str, carrier: str) -> str:
    """The end user a call names in its request's `field` or in `x-end-user-id` (its `carrier`: the HTTP
    header or the gRPC metadata), "" when neither: both given, they must agree (a call naming two end users
    is refused, never settled by a rule the caller would have to know). Each one's form is checked where it
    is read (the request's by `build_request`)."""
    if in_request and in_header and in_request != in_header:
        raise InvalidField(field, f"differs from the {END_USER_HEADER} {carrier}: send one of them, or the same id")
    return in_request or in_header


def build_request(
    message: ClientRequest, *, user: str, config: Config, now: float, timeout: float | None
) -> QueuedRequest:
    """Validate `message` for `user`; `timeout` is the call's remaining deadline in seconds, if any."""
    if not message.model:
        raise InvalidField("model", "required")
    model = config.model(message.model)
    if model is None:
        served = [m.name for m in config.models]
        raise ModelNotFound(f"unknown model {client_text(message.model)}; served models: {served}")
    if message.prompt and message.messages:
        raise InvalidField("prompt", "set either prompt or messages, not both")
    messages: tuple[ChatMessage, ...] | None = None
    if len(message.messages) > MAX_MESSAGES:
        raise InvalidField("messages", f"at most {MAX_MESSAGES}, got {len(message.messages)}")
    if message.messages:
        for i, m in enumerate(message.messages):
            if m.role not in ROLES:
                raise InvalidField(f"messages[{i}].role", f"must be one of {ROLES}, got {client_text(m.role)}")
        messages = tuple(message.messages)
        if not any(m.content.strip() for m in messages):
            raise InvalidField("messages", "all empty")
    elif not message.prompt.strip():
        raise InvalidField("prompt", "empty: set prompt or messages")
    max_tokens = model.default_max_tokens if message.max_tokens is None else message.max_tokens
    if not 1 <= max_tokens <= model.max_tokens_limit:
        raise InvalidField("max_tokens", f"must be between 1 and {model.max_tokens_limit}, got {max_tokens}")
    temperature = message.temperature
    if temperature is not None and not (math.isfinite(temperature) and 0 <= temperature <= 10):
        raise InvalidField("temperature", f"must be between 0 and 10, got {temperature}")
    top_p = message.top_p
    if top_p is not None and not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise InvalidField("top_p", f"must be in (0, 1], got {top_p}")
    presence_penalty = _penalty(message.presence_penalty, "presence_penalty")
    frequency_penalty = _penalty(message.frequency_penalty, "frequency_penalty")
    if len(message.prompt_cache_key) > MAX_CACHE_KEY_CHARS:
        raise InvalidField("prompt_cache_key", f"at most {MAX_CACHE_KEY_CHARS} characters")
    if len(message.stop) > MAX_STOP_STRINGS or any(not s for s in message.stop):
        raise InvalidField("stop", f"at most {MAX_STOP_STRINGS} non-empty strings")
    class_name = message.priority_class or config.scheduling.default_class
    priority_class = config.scheduling.priority_class(class_name)
    if priority_class is None:
        known = [c.name for c in config.scheduling.classes]
        raise InvalidField("priority_class", f"unknown class {client_text(class_name)}; known: {known}")
    if message.request_id and not _REQUEST_ID.match(message.request_id):
        raise InvalidField("request_id", "1-128 characters of letters, digits and ._:/-")
    if message.end_user and (problem := user_id_problem(message.end_user)):
        raise InvalidField(END_USER_FIELD, problem)
    if timeout is not None and timeout <= 0:  # e.g. while an HTTP body was uploading: a timeout, as in the queue
        raise DeadlineExceeded("the call's deadline passed before the request was admitted")
    deadlines = [now + t for t in (timeout, priority_class.queue_ttl_seconds or None) if t is not None]
    prompt_chars = len(message.prompt) if messages is None else sum(len(m.content) for m in messages)
    prompt_bytes = request_bytes(message)
    limit, limit_key = prompt_limit(model)
    if prompt_bytes > limit:
        raise PromptTooLarge(
            f"the prompt, messages and stop strings take {prompt_bytes} bytes of UTF-8; model {model.name} "
            f"accepts at most {limit} ({limit_key})",
            limit=limit,
        )
    return QueuedRequest(
        request_id=server_request_id(message.request_id),
        client_request_id=message.request_id,
        model=model.name,
        # One copy of each name however many requests carry it: the config's class name, and the user's and
        # end user's names interned (a queue of 100,000 requests from a few users holds a few strings).
        user=sys.intern(user),
        priority_class=priority_class.name,
        prompt=None if messages is not None else message.prompt,
        messages=messages,
        params=_shared_params(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=tuple(message.stop),
            seed=message.seed,
            ignore_eos=message.ignore_eos,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
        ),
        admitted_at=now,
        deadline=min(deadlines, default=None),
        prompt_chars=prompt_chars,
        prompt_bytes=prompt_chars if prompt_bytes == prompt_chars else prompt_bytes,  # ASCII: one int for both
        cache_key=message.prompt_cache_key,
        trace_context=message.trace_context,
        end_user=sys.intern(message.end_user),
    )


def _penalty(value: float | None, name: str) -> float | None:
    """An optional penalty, checked to lie in the range the OpenAI API and vLLM accept."""
    if value is None:
        return None
    if not (math.isfinite(value) and -2 <= value <= 2):
        raise InvalidField(name, f"must be between -2 and 2, got {value}")
    return value


def server_request_id(client_request_id: str) -> str:
    """A new unique id for a request: random, prefixed with the client's id when it gave one, so engine logs
    and journals can be matched to the client's (`~` never occurs in a client id)."""
    unique = uuid.uuid4().hex
    return f"{client_request_id}~{unique[:16]}" if client_request_id else unique


def prompt_limit(model: ModelConfig) -> tuple[int, str]:
    """The most prompt bytes a request for `model` can ever be admitted with, and the key that sets it:
    `max_prompt_bytes`, or a byte cap below it. A request over a cap on its own would be refused with a
    retry hint however empty the queues were, so it is refused as too large instead (on a tie the cap named
    is `max_prompt_bytes`)."""
    return min(
        (model.max_prompt_bytes, "max_prompt_bytes"),
        (model.max_queued_bytes_per_user, "max_queued_bytes_per_user"),
        (model.max_queued_bytes, "max_queued_bytes"),
    )


# Most calls carry one of a few settings: equal (frozen) settings share one object, which a queued request
# then holds for 8 bytes instead of ~100 (a bounded cache: odd settings just get their own).
_shared_params = functools.lru_cache(maxsize=1024, typed=True)(SamplingParams)


def request_bytes(message: ClientRequest) -> int:
    """The UTF-8 bytes a request makes the scheduler hold: its prompt, every message's role and content,
    and its stop strings (what `max_prompt_bytes` and the byte caps count)."""
    total = _utf8_length(message.prompt)
    for m in message.messages:
        total += _utf8_length(m.role) + _utf8_length(m.content)
    return total + sum(_utf8_length(s) for s in message.stop)


def _utf8_length(text: str) -> int:
    """Bytes of `text` in UTF-8, without copying an ASCII string (str.isascii is a flag check)."""
    return len(text) if text.isascii() else len(text.encode())

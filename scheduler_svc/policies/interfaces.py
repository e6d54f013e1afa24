"""What policies may see: read-only views of the requests and queues dispatch hands them.

A policy never receives the queues themselves, so it can look but never reorder or drop anything. The core's
`QueuedRequest` and `Flow` are these views; dispatch passes them in as such.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from backends.base import ChatMessage

OrderKey = tuple[float, ...]
"""A request's place in its user's queue by the ordering policy: smaller goes first, equal keys go in
arrival order. It must not change while the request is queued."""


class RequestView(Protocol):
    """What policies may read about a queued request."""

    @property
    def request_id(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def priority_class(self) -> str: ...
    @property
    def admitted_at(self) -> float: ...
    @property
    def deadline(self) -> float | None: ...
    @property
    def prompt_tokens_estimate(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...


class PromptView(RequestView, Protocol):
    """A request with what it asks the engine (what a locality-aware backend choice hashes)."""

    @property
    def prompt(self) -> str | None: ...
    @property
    def messages(self) -> tuple[ChatMessage, ...] | None: ...
    @property
    def cache_key(self) -> str: ...


class FlowView(Protocol):
    """One user's queued requests within one band, in the ordering policy's order."""

    @property
    def user(self) -> str: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[RequestView]: ...
    def head(self) -> RequestView: ...

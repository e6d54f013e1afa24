"""Faults a test can switch on at runtime through `POST /sim/faults`.

They live outside the engine API so that scheduler tests can make a healthy simulator misbehave the way
real engines do: a metrics endpoint that stops answering, a stream that fails or is cut after some tokens,
every request refused with one status. They are read live, so a change also hits streams in flight.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass
class Faults:
    """The current faults; all off by default."""

    metrics_down: bool = False
    """`GET /metrics` answers 503."""
    stream_error_after_tokens: int | None = None
    """After this many tokens a generation fails: in-stream error event (after HTTP 200) or 5xx/424."""
    stream_cut_after_tokens: int | None = None
    """After this many tokens the connection is closed mid-response, as if the engine died."""
    reject_all_with_status: int | None = None
    """Generation endpoints answer this HTTP status (with the flavor's error body) without running."""
    intake_delay_ms: int | None = None
    """A generation request waits this long before its body is read: it is on its way, and the engine has
    not got it (a client that leaves meanwhile never reaches the journal)."""
    answer_delay_ms: int | None = None
    """The OpenAI-compatible routes hold their answer (the response headers) this long after the request
    reached the engine (journaled `received`): a front end slow to answer. A client that leaves meanwhile
    aborts the request."""

    def in_stream(self, tokens_sent: int) -> str | None:
        """Which fault, if any, replaces the next token after `tokens_sent` tokens: "cut", "error" or None."""
        if self.stream_cut_after_tokens is not None and tokens_sent >= self.stream_cut_after_tokens:
            return "cut"
        if self.stream_error_after_tokens is not None and tokens_sent >= self.stream_error_after_tokens:
            return "error"
        return None

    def to_json(self) -> dict[str, Any]:
        """The faults as `GET /sim/faults` shows them."""
        return asdict(self)

    def update(self, body: Mapping[str, Any]) -> None:
        """Apply the keys present in `body` (others keep their value); all-or-nothing on bad input."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(body) - known)
        if unknown:
            raise ValueError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        checked: dict[str, Any] = {}
        for name, value in body.items():
            if name == "metrics_down":
                if not isinstance(value, bool):
                    raise ValueError("metrics_down must be true or false")
            elif value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} must be an integer or null")
            elif name == "reject_all_with_status" and value is not None and not 400 <= value <= 599:
                raise ValueError("reject_all_with_status must be an HTTP error status (400-599)")
            elif value is not None and value < 0:
                raise ValueError(f"{name} must not be negative")
            checked[name] = value
        for name, value in checked.items():
            setattr(self, name, value)

    def clear(self) -> None:
        """Switch every fault off."""
        for f in fields(self):
            setattr(self, f.name, f.default)

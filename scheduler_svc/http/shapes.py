"""OpenAI response shapes and their SSE framing: whole responses, stream chunks, usage, errors, comments.

A stream is `data: <chunk>` events ending in `data: [DONE]`; an error after the headers went out is one
`data: {"error": ...}` event instead (the SDKs raise it). Queue updates are SSE comment lines, which every
SSE client (the SDKs included) skips.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from scheduler_svc.http.parsing import Kind

DONE = b"data: [DONE]\n\n"
_FINISH_REASONS = ("stop", "length")


def event(data: dict[str, Any]) -> bytes:
    """One SSE data event."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def comment(text: str) -> bytes:
    """One SSE comment line (ignored by SSE clients; shown by a terminal)."""
    return b": " + text.replace("\n", " ").encode() + b"\n\n"


def usage(prompt_tokens: int | None, completion_tokens: int) -> dict[str, int]:
    """OpenAI's usage object; the prompt count is the engine's (0 when it reported none)."""
    prompt = prompt_tokens or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens, "total_tokens": prompt + completion_tokens}


def finish_reason(reason: str) -> str:
    return reason if reason in _FINISH_REASONS else "stop"


@dataclass(frozen=True, slots=True)
class Shapes:
    """Builds the response objects of one request (its id, creation time, model and endpoint kind)."""

    kind: Kind
    id: str
    created: int
    model: str

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat" else "text_completion"

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def response(self, text: str, reason: str, use: dict[str, int]) -> dict[str, Any]:
        """The whole (non-streamed) response."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason(reason), "logprobs": None}
        if self.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
            body = self._envelope("chat.completion", [choice])
        else:
            choice["text"] = text
            body = self._envelope("text_completion", [choice])
        body["usage"] = use
        return body

    def chunk(self, text: str, reason: str | None = None, *, role: bool = False) -> dict[str, Any]:
        """One stream chunk: text (and, on the last one, the finish reason)."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason and finish_reason(reason)}
        if self.kind == "chat":
            choice["delta"] = {"role": "assistant", "content": text} if role else {"content": text} if text else {}
        else:
            choice["text"] = text
        return self._envelope(self._chunk_object, [choice])

    def usage_chunk(self, use: dict[str, int]) -> dict[str, Any]:
        """The last chunk of a stream whose client asked for `stream_options.include_usage`."""
        body = self._envelope(self._chunk_object, [])
        body["usage"] = use
        return body

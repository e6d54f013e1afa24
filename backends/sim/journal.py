"""The simulator's own record of every request, one JSON line per event, that survives a SIGKILL.

Fault benchmarks (S7) count each request's outcome three ways: by the clients, by the scheduler and by
the engine. This journal is the engine's count. Each line is written with one `os.write` to a file opened
with `O_APPEND`, so nothing sits in a Python buffer when the process is killed, lines of a simulator
restarted on the same file follow the old ones, and a reader never sees half of a line from a live writer.

Events (`event` key), each with `t` (wall-clock seconds) and `pid`; every line about a request also has
`id` and `seq`, the engine's own arrival number, unique within one boot even when callers reuse an id:

- `boot`: the simulator started (a line before it means every request not yet ended there died with it);
- `received`: a request reached the engine: `id` (the engine's request id, which is the `X-Request-Id`
  header when the caller sent one), `x_request_id` (the header, or null), `prompt_bytes`, `prompt_tokens`,
  `max_tokens` and `tag` (the prompt's first line, truncated: load generators put their own id there);
- `started`: first admitted into the running batch (not again after a preemption);
- `first_token`: its first token was generated;
- `finished`: it ended normally: `tokens`, `reason` (length, eos, stop);
- `aborted`: the caller went away or the engine shut down: `reason`, `started`, `tokens`;
- `failed`: an injected fault (stream cut or error) or an engine error ended it: `reason`, `started`, `tokens`;
- `refused`: the API answered an error before the request reached the engine: `x_request_id`, `tag`,
  `status`, `message` (injected status, full queue, invalid request).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

TAG_CHARS = 200
"""At most this many characters of a prompt's first line are kept as its `tag`."""

FAILED_REASONS = ("injected stream cut", "injected stream error", "engine error")
"""Abort reasons the journal records as `failed` rather than `aborted`."""


def prompt_tag(prompt: str) -> str:
    """The prompt's first line, truncated: how a load generator's own request id comes back."""
    return prompt.split("\n", 1)[0][:TAG_CHARS]


class Journal:
    """An append-only JSON-lines file written without buffering; `Journal.disabled()` writes nothing."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fd: int | None = None
        if path:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self.write("boot")

    @classmethod
    def disabled(cls) -> Journal:
        """A journal that records nothing (no `--journal` given)."""
        return cls(None)

    @property
    def enabled(self) -> bool:
        """True when lines go to a file."""
        return self._fd is not None

    def write(self, event: str, **fields: Any) -> None:
        """Append one line; a single `os.write` so it is in the kernel before this returns."""
        if self._fd is None:
            return
        line = json.dumps({"event": event, "t": round(time.time(), 6), "pid": os.getpid(), **fields})
        os.write(self._fd, (line + "\n").encode())

    def close(self) -> None:
        """Close the file; later writes are dropped."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_journal(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every complete line of a journal (a torn last line, which O_APPEND writes should never leave, is skipped)."""
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):
                out.append(json.loads(line))
    return out

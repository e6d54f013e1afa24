"""Server-sent events, read from an aiohttp response body."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp


async def iter_sse_batches(response: aiohttp.ClientResponse) -> AsyncIterator[list[str]]:
    """Yield the `data` payloads of the events that each network read completed, as one list.

    Reading whatever the socket holds (instead of line by line) lets a caller that falls behind a fast
    engine handle several tokens at once: one gRPC message instead of many, with no waiting added.
    Multi-line data is joined with newlines; comments (`:`) and other fields are skipped, as the engines
    we talk to put everything in `data`. Both `data: x` and `data:x` occur (vLLM and TGI differ).
    """
    pending = b""
    data: list[str] = []
    async for chunk in response.content.iter_any():
        pending += chunk
        *lines, pending = pending.split(b"\n")
        events: list[str] = []
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8")
            if not line:
                if data:
                    events.append("\n".join(data))
                    data = []
            elif line.startswith("data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(" ") else value)
        if events:
            yield events
    if pending.strip():
        tail = pending.rstrip(b"\r").decode("utf-8")
        if tail.startswith("data:"):
            data.append(tail[5:].removeprefix(" "))
    if data:
        yield ["\n".join(data)]

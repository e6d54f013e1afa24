"""Server-sent events, read from an aiohttp response body."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp


async def iter_sse_data(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """Yield the `data` payload of each event (multi-line data joined with newlines).

    Comments (`:`) and other fields (`event:`, `id:`) are skipped: the engines we talk to put everything
    in `data`. Both `data: x` and `data:x` occur (vLLM and TGI differ).
    """
    data: list[str] = []
    async for raw in response.content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)

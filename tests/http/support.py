"""Helpers of the HTTP door tests: a live scheduler with its HTTP door on a free loopback port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from backends.base import Backend
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.config import BackendConfig, ModelConfig
from tests.helpers import make_config, serving

HTTP_ON = {"http_listen": "127.0.0.1:0"}


@asynccontextmanager
async def http_serving(
    factory: Callable[[ModelConfig, BackendConfig], Backend] | None = None,
    *,
    server: dict[str, Any] | None = None,
    **config: Any,
) -> AsyncIterator[tuple[SchedulerServer, str]]:
    """A running scheduler with the HTTP door on; yields it and the door's base URL (`http://host:port`)."""
    async with serving(make_config(server={**HTTP_ON, **(server or {})}, **config), factory) as running:
        yield running, f"http://{running.http_address}"


def chat(content: str = "hello", **fields: Any) -> dict[str, Any]:
    """A chat completion body for model "m"."""
    return {"model": "m", "messages": [{"role": "user", "content": content}], **fields}


async def sse_lines(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The response's lines as they arrive, without line ends and blank lines."""
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if line:
            yield line

"""Helpers of the HTTP door tests: a live scheduler with its HTTP door on a free loopback port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from backends.base import Backend
from scheduler_svc.app.server import SchedulerServer
from scheduler_svc.config import BackendConfig, ModelConfig
from tests.helpers import REPO_ROOT, ChildProcessService, make_config, serving

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


@dataclass
class ChildService(ChildProcessService):
    """The test service in a process of its own (tests/service/fuzz_server.py), HTTP door on."""

    grpc_address: str
    http_address: str


@contextmanager
def child_service(server: dict[str, Any] | None = None) -> Iterator[ChildService]:
    """Run the service with the HTTP door on (and `server` settings) in a child process, so its RSS is its own."""
    settings = json.dumps({**HTTP_ON, **(server or {})})
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "tests.service.fuzz_server", settings]
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
        )
        try:
            assert process.stdout is not None
            grpc_address, http_address = process.stdout.readline().strip(), process.stdout.readline().strip()
            if not http_address:
                log.seek(0)
                raise RuntimeError(f"the service did not start:\n{log.read()}")
            yield ChildService(process, log, grpc_address, http_address)
        finally:
            if process.stdin is not None:
                process.stdin.close()  # the service stops when its stdin closes
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

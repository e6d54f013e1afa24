"""The service the fuzz and memory tests attack, in a process of its own:
`python -m tests.service.fuzz_server ['{"http_listen": "127.0.0.1:0", ...}']`.

It serves the test config (with the `[server]` settings given as JSON, if any) with an engine that answers
every request at once and keeps nothing, prints `<grpc address>` on stdout (and `<http address>` on the
next line when the HTTP door is on), and stops when its stdin closes. A process apart lets a test measure
the service's RSS alone: hypothesis keeps the values it generated for the whole run, in the test's process,
and a client's own buffers are the test's.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncGenerator
from typing import Any

from backends.base import Finished, GenerationEvent, GenerationRequest, TextDelta
from backends.fake import FakeBackend
from scheduler_svc.app.event_loop import run_on
from scheduler_svc.app.logs import configure_logging
from tests.helpers import make_config, serving


async def _two_tokens(request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
    """Whatever max_tokens says, answer at once: valid requests finish far inside their deadline."""
    yield TextDelta("hi")
    yield Finished("length", prompt_tokens=1, completion_tokens=1)


class InstantEngine(FakeBackend):
    """A FakeBackend that does not record requests (their prompts would grow the RSS being measured)."""

    def __init__(self, *_: Any) -> None:
        super().__init__(_two_tokens, name="b0")

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        return _two_tokens(request)


async def main() -> None:
    configure_logging("warning")  # to stderr: stdout carries the addresses only
    server_settings = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    async with serving(make_config(server=server_settings), InstantEngine) as server:
        print(server.address, flush=True)
        if server.http_address:
            print(server.http_address, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes it


if __name__ == "__main__":
    run_on(make_config().server.event_loop, main)  # the loop `llmsched serve` ships with

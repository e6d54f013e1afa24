"""The service the fuzz test attacks, in a process of its own: `python -m tests.service.fuzz_server`.

It serves the test config with an engine that answers every request at once and keeps nothing, prints
`<grpc address>` on stdout, and stops when its stdin closes. A process apart lets the test measure the
service's RSS alone: hypothesis keeps the values it generated for the whole run, in the test's process.
"""

from __future__ import annotations

import asyncio
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
    configure_logging("warning")  # to stderr: stdout carries the address only
    async with serving(make_config(), InstantEngine) as server:
        print(server.address, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes it


if __name__ == "__main__":
    run_on(make_config().server.event_loop, main)  # the loop `llmsched serve` ships with

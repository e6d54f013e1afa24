"""The load generator's two ways to send one request: straight to the engine, or through the scheduler.

Both stream and fill the same `RequestRecord` (first token, every delta, the end), so a scenario runs one
workload function against either and the figures compare like with like. A cancelled request keeps what it
had received; the cancellation closes the HTTP stream or the gRPC call, which aborts it downstream.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Protocol, cast

import aiohttp
import grpc

from bench.records import RequestRecord
from clients import pb, pb_grpc


class RunClock:
    """Seconds since the run started, shared by the clients and the engine probe of one run."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def reset(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0


class Client(Protocol):
    """Sends one streamed request and records what came back."""

    label: str
    clock: RunClock

    async def run(
        self, record: RequestRecord, prompt: str, *, priority_class: str = "", engine_priority: int | None = None
    ) -> None:
        """Fill `record` from one streamed generation; errors end up in `record.error`."""
        ...


class DirectClient:
    """Talks to a vLLM-API engine over HTTP: its own FIFO, or its priority policy via `priority`."""

    def __init__(self, session: aiohttp.ClientSession, url: str, model: str, clock: RunClock, label: str) -> None:
        self._session = session
        self._url = url + "/v1/completions"
        self._model = model
        self.clock = clock
        self.label = label

    async def run(
        self, record: RequestRecord, prompt: str, *, priority_class: str = "", engine_priority: int | None = None
    ) -> None:
        body: dict[str, object] = {
            "model": self._model,
            "prompt": prompt,
            "max_tokens": record.max_tokens,
            "stream": True,
            "ignore_eos": True,
        }
        if engine_priority is not None:
            body["priority"] = engine_priority
        record.sent = self.clock.now()
        try:
            async with self._session.post(self._url, json=body) as response:
                if response.status != 200:
                    record.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                    return
                async for line in response.content:
                    if not line.startswith(b"data: {"):
                        continue
                    choices = json.loads(line[6:]).get("choices")
                    if choices:  # one chunk per generated token; the usage chunk has none
                        self._token(record, 1)
            record.finished = self.clock.now()
        except asyncio.CancelledError:
            record.error = "cancelled"
            raise
        except (aiohttp.ClientError, ValueError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"

    def _token(self, record: RequestRecord, n: int) -> None:
        now = self.clock.now()
        if record.first_token is None:
            record.first_token = now
        record.tokens += n
        record.token_times.append((now, n))


class ScheduledClient:
    """Talks to llm-scheduler over gRPC (`Stream`), identified by `x-user-id`."""

    def __init__(self, stub: pb_grpc.SchedulerServiceStub, model: str, clock: RunClock, label: str) -> None:
        self._stub = stub
        self._model = model
        self.clock = clock
        self.label = label

    async def run(
        self, record: RequestRecord, prompt: str, *, priority_class: str = "", engine_priority: int | None = None
    ) -> None:
        request = pb.StreamRequest(
            params=pb.GenerationParams(
                model=self._model,
                prompt=prompt,
                max_tokens=record.max_tokens,
                ignore_eos=True,
                priority_class=priority_class,
            )
        )
        record.sent = self.clock.now()
        call = cast(
            "grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]",
            self._stub.Stream(request, metadata=(("x-user-id", record.user),)),
        )
        try:
            async for event in call:
                if event.HasField("delta"):
                    now = self.clock.now()
                    if record.first_token is None:
                        record.first_token = now
                    n = event.delta.tokens or 1
                    record.tokens += n
                    record.token_times.append((now, n))
            record.finished = self.clock.now()
        except asyncio.CancelledError:
            record.error = "cancelled"
            call.cancel()
            raise
        except grpc.aio.AioRpcError as exc:
            record.error = f"{exc.code().name}: {exc.details()}"

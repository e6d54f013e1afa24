"""The load generator's ways to send one request: straight to the engine, or through the scheduler's gRPC
door or its OpenAI-compatible HTTP door.

All stream and fill the same `RequestRecord` (first token, every delta, the end), so a scenario runs one
workload function against any of them and the figures compare like with like: the first token is the first
chunk that carries text, as the gRPC client's is the first delta. A cancelled request keeps what it had
received; the cancellation closes the HTTP stream or the gRPC call, which aborts it downstream.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import aiohttp
import grpc

from bench.records import RequestRecord
from clients import pb, pb_grpc
from clients.events import Timings


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


class _CompletionsClient:
    """Streams from an OpenAI-compatible `POST /v1/completions` at `url` (an engine, or the HTTP door)."""

    def __init__(self, session: aiohttp.ClientSession, url: str, model: str, clock: RunClock, label: str) -> None:
        self._session = session
        self._url = url + "/v1/completions"
        self._model = model
        self.clock = clock
        self.label = label


class DirectClient(_CompletionsClient):
    """Talks to a vLLM-API engine over HTTP: its own FIFO, or its priority policy via `priority`."""

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
                record.intake = self.clock.now() - record.sent
                async for line in response.content:
                    if not line.startswith(b"data: {"):
                        continue
                    choices = json.loads(line[6:]).get("choices")
                    if choices:  # one chunk per generated token; the usage chunk has none
                        record.received(self.clock.now(), 1)
            record.finished = self.clock.now()
        except asyncio.CancelledError:
            record.error = "cancelled"
            raise
        except (aiohttp.ClientError, ValueError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"


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
                    record.received(self.clock.now(), event.delta.tokens or 1)
                elif event.HasField("finished"):
                    timings = Timings.from_pb(event.finished.timings)
                    record.scheduler_ttft = timings.time_to_first_token
                    record.scheduler_queue_wait = timings.queue_wait
                    record.intake = timings.engine_accept
            record.finished = self.clock.now()
        except asyncio.CancelledError:
            record.error = "cancelled"
            call.cancel()
            raise
        except grpc.aio.AioRpcError as exc:
            record.error = f"{exc.code().name}: {exc.details()}"


@dataclass(frozen=True)
class SseChunk:
    """What one line of an OpenAI completions stream says: text (maybe empty), usage, the end, or an error."""

    text: str = ""
    completion_tokens: int | None = None  # from the usage chunk
    done: bool = False
    error: str | None = None


def parse_sse_line(line: bytes) -> SseChunk | None:
    """One line of an OpenAI `/v1/completions` SSE stream; None for what carries nothing (blank lines,
    comments such as the door's `: queued ...`, other fields). Raises ValueError on a malformed data line."""
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if data == b"[DONE]":
        return SseChunk(done=True)
    body: Any = json.loads(data)
    if not isinstance(body, dict):
        raise ValueError(f"SSE data is not an object: {data[:80]!r}")
    if "error" in body:  # an error after the headers went out
        error = body["error"]
        message = error.get("message") if isinstance(error, dict) else error
        code = error.get("code") if isinstance(error, dict) else None
        return SseChunk(error=f"{code or 'error'}: {message}")
    usage = body.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    choices = body.get("choices") or []
    first = choices[0] if choices and isinstance(choices[0], dict) else {}
    text = first.get("text") or ""
    return SseChunk(text=text, completion_tokens=tokens if isinstance(tokens, int) else None)


class HttpSchedulerClient(_CompletionsClient):
    """Talks to llm-scheduler's OpenAI-compatible HTTP door (`POST /v1/completions`, SSE), identified by
    the trusted `x-user-id` header, with its class in `x-priority-class`: the request a gRPC client sends.

    Every chunk with text counts as one token as it arrives (the door sends one chunk per engine chunk);
    the usage chunk at the end gives the request's exact count.
    """

    async def run(
        self, record: RequestRecord, prompt: str, *, priority_class: str = "", engine_priority: int | None = None
    ) -> None:
        body = {
            "model": self._model,
            "prompt": prompt,
            "max_tokens": record.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        headers = {"x-user-id": record.user}
        if priority_class:
            headers["x-priority-class"] = priority_class
        record.sent = self.clock.now()
        try:
            async with self._session.post(self._url, json=body, headers=headers) as response:
                if response.status != 200:
                    record.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                    return
                done = await self._read(record, response)
                if record.error is None:
                    if done:
                        record.finished = self.clock.now()
                    else:
                        record.error = "the stream ended without [DONE]"
        except asyncio.CancelledError:
            record.error = "cancelled"
            raise
        except (aiohttp.ClientError, ValueError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"

    async def _read(self, record: RequestRecord, response: aiohttp.ClientResponse) -> bool:
        """Fill `record` from the stream, read to its end (so the connection is reused, as the direct client's
        is); True when `[DONE]` arrived."""
        done = False
        async for line in response.content:
            chunk = parse_sse_line(line)
            if chunk is None:
                continue
            if chunk.error is not None:
                record.error = chunk.error
                return False
            done |= chunk.done
            if chunk.text:
                record.received(self.clock.now(), 1)
            if chunk.completion_tokens is not None:
                record.tokens = chunk.completion_tokens
        return done


class RoundRobinClient:
    """Sends each call to the next of several clients (one per scheduler replica), as a round-robin load
    balancer in front of the replicas would; the record notes which replica served it."""

    def __init__(self, clients: Sequence[Client]) -> None:
        if not clients:
            raise ValueError("a round-robin client needs at least one client")
        self._clients = list(clients)
        self._next = 0
        self.label = clients[0].label
        self.clock = clients[0].clock

    async def run(
        self, record: RequestRecord, prompt: str, *, priority_class: str = "", engine_priority: int | None = None
    ) -> None:
        index = self._next
        self._next = (index + 1) % len(self._clients)
        record.replica = index
        await self._clients[index].run(record, prompt, priority_class=priority_class, engine_priority=engine_priority)

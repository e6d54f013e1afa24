"""S7's clients: every call tagged `s7:<n>` (or `storm:<n>`) in its prompt's first line, and how it ended as
the client saw it; a call cancels itself at its first queued or running event, or when a storm breaks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import cast

import grpc

from bench.configs import SCHEDULED_MODEL
from bench.scenarios.s7.params import S7Params
from clients import pb, pb_grpc
from clients.client import error_reason


@dataclass
class Call:
    """One client call and how it ended, as the client saw it."""

    n: int
    kind: str  # flood, qcancel, rcancel, dup-first, dup-second, oversized, storm
    user: str
    request_id: str
    admitted: bool = False
    dispatches: int = 0
    dispatches_after_token: int = 0
    tokens: int = 0
    end: str = ""  # completed, cancelled, error, "" while running, hung
    code: str = ""
    reason: str = ""
    cancel_phase: str = ""  # queued, dispatched, running, storm
    prefix: str = "s7"

    @property
    def tag(self) -> str:
        return f"{self.prefix}:{self.n}"

    @property
    def outcome(self) -> str | None:
        """The scheduler outcome this call's ending corresponds to (None: not admitted)."""
        if not self.admitted:
            return None
        if self.end == "completed":
            return "completed"
        if self.end == "cancelled":
            return "cancelled"
        if self.end == "error":
            return "expired" if self.code == "DEADLINE_EXCEEDED" else "failed"
        return None  # hung: no outcome at all


class Load:
    """The clients of one S7 run: starts calls, keeps their records."""

    def __init__(self, stubs: list[pb_grpc.SchedulerServiceStub], p: S7Params, prefix: str = "s7") -> None:
        self.stubs = stubs
        self.p = p
        self.prefix = prefix  # of every call's tag: the storms' calls are told apart from the flood's
        self.calls: list[Call] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self._n = 0
        # Set around the engine's SIGKILL: a cancel then could race the engine failing the same request
        # (the server ends it FAILED while the client, a moment behind, cancels), and the two counts would
        # differ by the race, not by any fault. Calls that would be cancelled then run to their real end.
        self.cancel_paused = False

    def new(self, kind: str, user: str, request_id: str | None = None) -> Call:
        self._n += 1
        call = Call(self._n, kind, user, request_id or f"{self.prefix}-{self._n}", prefix=self.prefix)
        self.calls.append(call)
        return call

    def prompt(self, call: Call, size: int | None = None) -> str:
        size = self.p.prompt_bytes if size is None else size
        body = f"{call.tag}\n" + f"Request {call.n} of user {call.user}. "
        return body + "x" * max(0, size - len(body))

    def start(self, call: Call, awaitable: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(awaitable)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def run(
        self, call: Call, *, prompt: str | None = None, cancel_on: str = "", admitted: asyncio.Event | None = None
    ) -> None:
        """One Stream call; `cancel_on` "queued" or "running" cancels it at its first such event."""
        params = pb.GenerationParams(
            model=SCHEDULED_MODEL,
            prompt=prompt if prompt is not None else self.prompt(call),
            # A call to cancel asks for a long answer, so it is surely still running when this
            # (slow, loaded) client reads its first token; a short one could already be over at the server.
            max_tokens=self.p.cancel_tokens if cancel_on else self.p.max_tokens,
            ignore_eos=True,
            request_id=call.request_id,
        )
        request = pb.StreamRequest(params=params)
        stub = self.stubs[call.n % len(self.stubs)]
        rpc = cast(
            "grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]",
            stub.Stream(request, metadata=(("x-user-id", call.user),)),
        )
        try:
            async for event in rpc:
                if event.HasField("queued"):
                    call.admitted = True
                    if admitted is not None:
                        admitted.set()
                    if cancel_on == "queued" and call.dispatches == 0 and not self.cancel_paused:
                        call.cancel_phase = "queued"
                elif event.HasField("dispatched"):
                    call.dispatches += 1
                    call.dispatches_after_token += call.tokens > 0
                elif event.HasField("delta"):
                    call.tokens += event.delta.tokens or 1
                    if cancel_on == "running" and not self.cancel_paused:
                        call.cancel_phase = "running"
                elif event.HasField("finished"):
                    call.end = "completed"
                if call.cancel_phase and not call.end:
                    if rpc.cancel():
                        call.end = "cancelled"
                        return
                    # The server had already ended the call (its events were still in flight to this slow
                    # client): it was not cancelled, so read on to its real ending.
                    call.cancel_phase, cancel_on = "", ""
            if not call.end:
                call.end, call.code = "error", "OK_WITHOUT_FINISHED"
        except grpc.aio.AioRpcError as exc:
            call.end, call.code, call.reason = "error", exc.code().name, error_reason(exc) or ""
        except asyncio.CancelledError:
            if not call.end:
                call.end = "hung"
            rpc.cancel()
            raise

    async def run_until(self, call: Call, storm: asyncio.Event, admitted: asyncio.Event, round_: StormRound) -> None:
        """One Stream call asking for a long answer, cancelled when the storm breaks (if still going)."""
        params = pb.GenerationParams(
            model=SCHEDULED_MODEL,
            prompt=self.prompt(call, self.p.storm_prompt_bytes),
            max_tokens=self.p.storm_tokens,
            ignore_eos=True,
            request_id=call.request_id,
        )
        stub = self.stubs[call.n % len(self.stubs)]
        rpc = cast(
            "grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]",
            stub.Stream(pb.StreamRequest(params=params), metadata=(("x-user-id", call.user),)),
        )

        async def read() -> None:
            try:
                async for event in rpc:
                    if event.HasField("queued"):
                        call.admitted = True
                        admitted.set()
                    elif event.HasField("dispatched"):
                        call.dispatches += 1
                        round_.dispatched()
                    elif event.HasField("delta"):
                        call.tokens += event.delta.tokens or 1
                    elif event.HasField("finished"):
                        call.end = "completed"
            except grpc.aio.AioRpcError as exc:
                call.end, call.code, call.reason = call.end or "error", exc.code().name, error_reason(exc) or ""
            finally:
                admitted.set()  # or refused: either way it has its answer to admission

        reader = asyncio.ensure_future(read())
        breaks = asyncio.ensure_future(storm.wait())
        await asyncio.wait({reader, breaks}, return_when=asyncio.FIRST_COMPLETED)
        breaks.cancel()
        if not reader.done() and rpc.cancel():
            call.end, call.cancel_phase = "cancelled", "storm"
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        if not call.end:
            call.end, call.code = "error", "OK_WITHOUT_FINISHED"


class StormRound:
    """How many of a storm's calls an engine took, and the moment it is full of them."""

    def __init__(self, engine_slots: int) -> None:
        self.count = 0
        self.full = asyncio.Event()
        self._slots = engine_slots

    def dispatched(self) -> None:
        self.count += 1
        if self.count >= self._slots:
            self.full.set()

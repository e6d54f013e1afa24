"""The memory run's calls: opened at a pace (Stream calls wait for their first `queued` event, Submit calls
for the scheduler to show them queued), every one queued or the run fails cleanly, then cancelled."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import grpc

from bench.harness import wait_until
from bench.tools.stream_memory.engine import MODEL
from bench.tools.stream_memory.scheduler import Memory, mib, model_state, wait_queued
from clients import pb, pb_grpc

PROMPT = "Summarise the attached report in three sentences."  # as in tests/unit/test_memory_bound.py
AnyCall = Any  # grpc.aio.UnaryStreamCall or grpc.aio.UnaryUnaryCall
StreamCall = grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]


def new_call(
    stubs: Sequence[pb_grpc.SchedulerServiceStub], i: int, users: int, unary: bool, prompt: str = PROMPT
) -> AnyCall:
    """Call number `i`: user `u{i % users}`, on channel `i % len(stubs)`."""
    stub = stubs[i % len(stubs)]
    metadata = (("x-user-id", f"u{i % users}"),)
    params = pb.GenerationParams(model=MODEL, prompt=prompt, max_tokens=16)
    if unary:
        return stub.Submit(pb.SubmitRequest(params=params), metadata=metadata)
    return stub.Stream(pb.StreamRequest(params=params), metadata=metadata)


async def open_streams(
    stubs: Sequence[pb_grpc.SchedulerServiceStub], count: int, args: argparse.Namespace, calls: list[AnyCall]
) -> Counter[str]:
    """Open `count` Stream calls into `calls`, at most `args.pace` of them (0: all) not yet answered with
    their first `queued` event. Returns the failures by status code."""
    failures: Counter[str] = Counter()
    numbers = iter(range(count))

    async def opener() -> None:
        for i in numbers:
            call: StreamCall = new_call(stubs, i, args.users, False, _prompt(args))
            calls.append(call)
            try:
                event = await call.read()
            except grpc.aio.AioRpcError as exc:
                failures[exc.code().name] += 1
                continue
            if not isinstance(event, pb.StreamResponse) or not event.HasField("queued"):
                failures[f"first event not queued: {event!r}"] += 1

    await asyncio.gather(*(opener() for _ in range(min(args.pace or count, count))))
    return failures


async def open_unary(
    stubs: Sequence[pb_grpc.SchedulerServiceStub], count: int, args: argparse.Namespace, calls: list[AnyCall]
) -> Counter[str]:
    """Start `count` Submit calls into `calls` in batches of `args.pace` (0: all at once), each batch once
    the scheduler shows the previous ones queued (a Submit call says nothing until it ends)."""

    async def confirmed() -> bool:
        ended = sum(1 for call in calls if call.done())
        return (await model_state(stubs[0])).queued + ended >= len(calls)

    step = args.pace or count
    for first in range(0, count, step):
        calls.extend(
            new_call(stubs, i, args.users, True, _prompt(args)) for i in range(first, min(first + step, count))
        )
        await wait_until(confirmed, f"{len(calls)} Submit calls queued or ended", args.timeout, interval=0.02)
    failures: Counter[str] = Counter()
    for call in calls:
        if call.done():
            failures[(await call.code()).name] += 1
    return failures


async def cancel_all(calls: Sequence[AnyCall]) -> None:
    for call in calls:
        call.cancel()
    if calls and hasattr(calls[0], "__await__"):  # unary calls: let them finish as cancelled
        for call in calls:
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await call


class OpenFailed(Exception):
    """Some calls were refused instead of queued, or opening them took too long."""


async def open_calls(
    stubs: Sequence[pb_grpc.SchedulerServiceStub], count: int, args: argparse.Namespace, pid: int
) -> list[AnyCall]:
    """Open `count` calls and wait until the scheduler shows them all queued. When gRPC or the scheduler
    refused some, or it took longer than `args.timeout`, cancels what was opened and raises OpenFailed."""
    calls: list[AnyCall] = []
    start = time.monotonic()
    try:
        async with asyncio.timeout(args.timeout):
            failures = await (open_unary if args.unary else open_streams)(stubs, count, args, calls)
            if not failures:
                await wait_queued(stubs[0], count, args.timeout)
                return calls
        problem = ", ".join(f"{n} {code}" for code, n in failures.most_common())
        problem = f"{failures.total()} of {count} calls were not queued: {problem}"
    except TimeoutError:
        queued = (await model_state(stubs[0])).queued
        problem = (
            f"opening {count} calls took over {args.timeout:g} s: {len(calls)} started, {queued} queued, "
            f"scheduler RSS {mib(Memory.of(pid).rss)}"
        )
    problem += f" ({time.monotonic() - start:.1f} s)"
    await cancel_all(calls)
    await wait_queued(stubs[0], 0, args.timeout)
    raise OpenFailed(problem)


def _prompt(args: argparse.Namespace) -> str:
    """The prompt every call sends: the short default, or `--prompt-bytes` of ASCII."""
    return "x" * args.prompt_bytes if args.prompt_bytes else PROMPT

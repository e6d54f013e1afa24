"""One round of the memory run: N calls opened and held queued, the scheduler's resident memory and CPU read
before, while held and after they are cancelled; and the round's report."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bench.harness import cpu_seconds
from bench.tools.stream_memory.calls import cancel_all, open_calls
from bench.tools.stream_memory.scheduler import Memory, mib, wait_queued
from clients import pb_grpc


@dataclass
class Round:
    """What one round of N calls measured."""

    opened_s: float
    open_cpu_s: tuple[float, float]  # (scheduler, client) CPU seconds spent while opening
    after_open: Memory
    after_hold: Memory
    hold_cpu_percent: float
    client: Memory
    drained_s: float
    after_drain: Memory


async def one_round(stubs: Sequence[pb_grpc.SchedulerServiceStub], pid: int, args: argparse.Namespace) -> Round:
    """Open N calls, measure with all of them queued, cancel them, wait for the queue to drain."""
    start, scheduler_cpu, client_cpu = time.monotonic(), cpu_seconds(pid), time.process_time()
    calls = await open_calls(stubs, args.streams, args, pid)
    opened_s = time.monotonic() - start
    open_cpu_s = (cpu_seconds(pid) - scheduler_cpu, time.process_time() - client_cpu)
    after_open = Memory.of(pid)
    cpu_start, wall_start = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(args.hold_seconds)  # a measuring window, not synchronisation
    hold_cpu = (cpu_seconds(pid) - cpu_start) / (time.monotonic() - wall_start) * 100
    await wait_queued(stubs[0], args.streams, args.timeout)  # still all queued, none dispatched
    after_hold = Memory.of(pid)
    client = Memory.of("self")
    drain_start = time.monotonic()
    await cancel_all(calls)
    await wait_queued(stubs[0], 0, args.timeout)
    drained_s = time.monotonic() - drain_start
    return Round(opened_s, open_cpu_s, after_open, after_hold, hold_cpu, client, drained_s, Memory.of(pid))


def report(number: int, r: Round, before: Memory, args: argparse.Namespace) -> None:
    kind = "submit" if args.unary else "stream"
    grown = r.after_open.rss - before.rss
    held = r.after_hold.rss - before.rss
    print(f"round {number}:")
    print(
        f"  time to open {args.streams} calls, all queued: {r.opened_s:.1f} s ({args.streams / r.opened_s:.0f}/s); "
        f"CPU meanwhile: scheduler {r.open_cpu_s[0]:.1f} s, client {r.open_cpu_s[1]:.1f} s"
    )
    print(f"  scheduler RSS with all queued: {mib(r.after_open.rss)} (+{mib(grown)})")
    print(
        f"  scheduler RSS after {args.hold_seconds:g} s held: {mib(r.after_hold.rss)} (+{mib(held)}) = "
        f"{held / args.streams:.0f} bytes per queued {kind}; scheduler CPU while holding: {r.hold_cpu_percent:.0f}%"
    )
    if args.prompt_bytes:
        queued_bytes = args.streams * args.prompt_bytes
        print(
            f"  per queued prompt byte: {held / queued_bytes:.2f} bytes of scheduler RSS ({mib(queued_bytes)} queued)"
        )
    print(f"  client RSS: {mib(r.client.rss)} (peak {mib(r.client.peak)})")
    print(
        f"  cancelled all: queue drained to 0 in {r.drained_s:.1f} s; scheduler RSS after: "
        f"{mib(r.after_drain.rss)} (peak {mib(r.after_drain.peak)})"
    )

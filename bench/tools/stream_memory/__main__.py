"""`python -m bench.tools.stream_memory`: memory of the scheduler process per queued request (see the package)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Sequence

import aiohttp
import grpc

from bench.harness import scheduler_process, wait_until
from bench.tools import stream_memory
from bench.tools.stream_memory.calls import OpenFailed, cancel_all, open_calls
from bench.tools.stream_memory.engine import full_engine
from bench.tools.stream_memory.rounds import one_round, report
from bench.tools.stream_memory.scheduler import (
    Memory,
    mib,
    model_state,
    scheduler_counters,
    scheduler_toml,
    wait_queued,
)
from clients import pb_grpc
from engines import free_port


async def run(args: argparse.Namespace) -> int:
    capacity = max(args.streams, args.warmup)
    metrics_port = free_port()
    async with contextlib.AsyncExitStack() as stack:
        engine_url = await stack.enter_async_context(full_engine(args.waiting_target))
        toml = scheduler_toml(
            engine_url,
            metrics_port,
            capacity=capacity,
            users=args.users,
            waiting_target=args.waiting_target,
            update_interval=args.update_interval,
            prompt_bytes=args.prompt_bytes,
        )
        sched = await stack.enter_async_context(scheduler_process(toml))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        pid = sched.proc.popen.pid
        channels = [grpc.aio.insecure_channel(sched.target) for _ in range(args.channels)]
        try:
            stubs = [pb_grpc.SchedulerServiceStub(channel) for channel in channels]

            async def gate_closed() -> bool:
                gates = (await model_state(stubs[0])).gates
                return bool(gates) and all(
                    g.metrics_fresh and not g.open and g.engine_waiting >= args.waiting_target for g in gates
                )

            await wait_until(gate_closed, "gate closed on a fresh engine reading", 30.0)
            if args.warmup:
                await cancel_all(await open_calls(stubs, args.warmup, args, pid))
                await wait_queued(stubs[0], 0, args.timeout)
            before = Memory.of(pid)
            print(
                f"{'Submit' if args.unary else 'Stream'} calls: N={args.streams}, {args.users} users, "
                f"{args.channels} channel(s), at most {args.pace or 'all'} opening at once; scheduler pid {pid}"
            )
            print(
                f"scheduler RSS before: {mib(before.rss)} (after a warm-up of {args.warmup} calls); "
                f"queue_update_interval_seconds {args.update_interval:g}"
            )
            for number in range(1, args.rounds + 1):
                report(number, await one_round(stubs, pid, args), before, args)
            async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as response:
                counters = scheduler_counters(await response.text())
        except OpenFailed as exc:
            print(f"FAILED: {exc}")
            return 1
        finally:
            for channel in channels:
                await channel.close(None)
    total = args.warmup + args.streams * args.rounds
    print(
        f"scheduler counters: dispatched {counters['dispatched']:.0f}, cancelled {counters['cancelled']:.0f} of "
        f"{total} admitted, completed {counters['completed']:.0f}, failed {counters['failed']:.0f}, "
        f"expired {counters['expired']:.0f}"
    )
    if counters["dispatched"] or counters["cancelled"] != total:
        print("UNEXPECTED: requests were dispatched, or not every cancelled call was counted cancelled")
        return 1
    return 0


# (flag, type, default, help) of every option but --unary
OPTIONS: tuple[tuple[str, type, float, str], ...] = (
    ("--streams", int, 20000, "N: calls held queued (default: %(default)s)"),
    ("--users", int, 100, "users the calls are spread over (%(default)s)"),
    ("--channels", int, 1, "gRPC channels the calls share (%(default)s)"),
    ("--pace", int, 500, "most calls opening at once, not yet queued (%(default)s; 0: all at once, see the package)"),
    ("--warmup", int, 200, "calls opened and cancelled first (%(default)s)"),
    ("--rounds", int, 1, "open/cancel rounds, to see memory come back or not"),
    ("--hold-seconds", float, 3.0, "window for RSS and CPU while held"),
    ("--update-interval", float, 1.0, "the scheduler's queue_update_interval_seconds (%(default)s, its default)"),
    ("--waiting-target", int, 3, "the gate's engine waiting target"),
    ("--timeout", float, 180.0, "seconds allowed for each wait"),
    ("--prompt-bytes", int, 0, "send prompts of this many ASCII bytes (0: a short prompt)"),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=stream_memory.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--unary", action="store_true", help="hold Submit calls instead of Stream calls")
    for flag, kind, default, text in OPTIONS:
        parser.add_argument(flag, type=kind, default=default, help=text)
    args = parser.parse_args(argv)
    if (
        min(args.streams, args.users, args.channels, args.rounds, args.waiting_target) < 1
        or min(args.warmup, args.pace) < 0
    ):
        parser.error("counts must be positive")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())

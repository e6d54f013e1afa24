"""Memory of the scheduler process per queued request, with N clients holding open `Stream` RPCs.

Why: the service promises that memory stays bounded under a flood of 100,000 queued requests (the
`max_queued` caps bound the count; this measures the cost of each). The scheduler core alone was measured
at about 2 KB per queued request with tracemalloc (`tests/unit/test_memory_bound.py`), but a queued
request held by a real client also costs the process gRPC per-call state (the C-core call and its arena,
the HTTP/2 stream, the servicer's asyncio task and async generator). This benchmark reads the whole
process's resident memory (VmRSS from /proc/<pid>/status) before and after N streams are queued, so the
figure includes all of it.

How the engine stays full: a `llmsched sim` engine with one slot (`--max-num-seqs 1`) and an engine step
of one hour is given `waiting_target + 1` requests directly over HTTP, as another client of the engine
would send them: one runs (its first step never ends within the run), the others wait. The engine's
Prometheus metrics then honestly show `vllm:num_requests_waiting` at the scheduler's waiting target, so
the gate stays closed and nothing the scheduler queues is dispatched. `gate.stale_after_seconds` is set
to an hour because on a busy event loop (tens of thousands of streams opening on two CPUs) a scrape may
be late, and a reading older than the default 1 s would let the gate's fallback send up to
`fallback_max_in_flight` requests: the engine's state does not change during the run, so the last reading
stays true. The streams are opened only once GetQueueState shows the gate closed on a fresh reading, and
the run checks at the end that the scheduler dispatched nothing.

Sequence: start the engine and fill it; start `llmsched serve` with caps that allow N queued requests
(spread over `--users` users); open and cancel a small warm-up batch (so one-time costs such as code paths
first taken and the first per-user queues are not charged to the measured streams); read the scheduler's
RSS; open N `Stream` calls (or `Submit` calls with `--unary`) from this one process with grpc.aio over
`--channels` channels; wait for each stream's first `queued` event and for GetQueueState to report N
queued; read RSS again, and again after `--hold-seconds` (with the scheduler's CPU use over that window:
with nothing moving in the queues it should be near zero, since a queued stream is only woken when its
position changes); cancel every
call and wait for the queue to drain to 0 (cancelled requests are withdrawn), and check that the
scheduler counted every admitted request as cancelled and dispatched none.

Opening pace: at most `--pace` calls (default 500) are in flight without their first `queued` event.
gRPC core keeps calls that arrive before the Python server asks for the next one in a pending list and
refuses them with CANCELLED beyond `grpc.server.max_pending_requests` (default 1,000, hard limit 3,000);
the scheduler raises both to its queue capacity, and `--pace 0` (everything at once) checks that. One
channel holds 100,000 concurrent streams; `--channels` spreads them over more connections for comparison.

`--update-interval` sets the scheduler's `queue_update_interval_seconds` (default 1 s, the service's own
default): how often at most a stream whose position changed is told. A run fails cleanly (calls
cancelled, processes stopped) when opening takes longer than `--timeout`.

    .venv/bin/python -m bench.stream_memory --streams 20000
    .venv/bin/python -m bench.stream_memory --streams 5000 --unary
    .venv/bin/python -m bench.stream_memory --streams 100000 --timeout 300
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp
import grpc

from backends.metrics import MetricSamples
from bench.clients import RunClock
from bench.configs import validated_toml
from bench.harness import cpu_seconds, free_port, scheduler_process, simulator
from bench.probe import EngineProbe
from clients import pb, pb_grpc

MODEL = "sim-model"
PROMPT = "Summarise the attached report in three sentences."  # as in tests/unit/test_memory_bound.py
ENGINE_STEP_MS = 3_600_000.0  # one engine step lasts an hour: the engine's running request never moves on

AnyCall = Any  # grpc.aio.UnaryStreamCall or grpc.aio.UnaryUnaryCall
StreamCall = grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]


@dataclass(frozen=True)
class Memory:
    """Resident memory of a process, in bytes."""

    rss: int
    peak: int

    @classmethod
    def of(cls, pid: int | str) -> Memory:
        """VmRSS and VmHWM from /proc/<pid>/status."""
        fields: dict[str, int] = {}
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
        return cls(rss=fields["VmRSS"], peak=fields["VmHWM"])


def mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


async def wait_until(check: Callable[[], Awaitable[bool]], what: str, timeout: float, interval: float = 0.1) -> float:
    """Poll `check` until it holds; returns the seconds it took. Polling is how one watches another process."""
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not reached after {timeout:.0f}s")
        await asyncio.sleep(interval)
    return time.monotonic() - start


# -- the engine ---------------------------------------------------------------------------------------------


async def _hold(session: aiohttp.ClientSession, url: str) -> None:
    """One streamed completion straight to the engine, kept open until cancelled."""
    body = {"model": MODEL, "prompt": "hold", "max_tokens": 16, "stream": True, "ignore_eos": True}
    async with session.post(url + "/v1/completions", json=body) as response:
        async for _ in response.content:
            pass


@asynccontextmanager
async def full_engine(waiting_target: int) -> AsyncIterator[str]:
    """A one-slot simulator whose waiting queue shows `waiting_target` requests for as long as this lasts."""
    flags = ("--max-num-seqs", "1", "--decode-base-ms", str(ENGINE_STEP_MS))
    async with simulator(*flags) as url, aiohttp.ClientSession() as session:
        holders = [asyncio.create_task(_hold(session, url)) for _ in range(waiting_target + 1)]
        probe = EngineProbe(session, url, RunClock())

        async def filled() -> bool:
            for task in holders:
                if task.done():
                    task.result()  # raises what went wrong
                    raise RuntimeError("an engine-holding request ended early")
            sample = await probe.read()
            return sample is not None and sample.waiting >= waiting_target and sample.running == 1

        try:
            await wait_until(filled, "engine waiting queue at the target", 30.0)
            yield url
        finally:
            for task in holders:
                task.cancel()
            await asyncio.gather(*holders, return_exceptions=True)


# -- the scheduler ------------------------------------------------------------------------------------------


def scheduler_toml(
    engine_url: str,
    metrics_port: int,
    *,
    capacity: int,
    users: int,
    waiting_target: int,
    update_interval: float,
    prompt_bytes: int = 0,
) -> str:
    """One model on the engine, caps that admit `capacity` requests spread evenly over `users` users."""
    config: dict[str, Any] = {
        "server": {
            "listen": "127.0.0.1:{GRPC_PORT}",
            "metrics_listen": f"127.0.0.1:{metrics_port}",
            "log_level": "warning",
            "shutdown_grace_seconds": 1.0,
            "queue_update_interval_seconds": update_interval,
        },
        "scheduling": {"fairness": "round_robin"},
        "models": [
            {
                "name": MODEL,
                "max_queued": capacity,
                "max_queued_per_user": math.ceil(capacity / users),
                "max_prompt_bytes": max(prompt_bytes, 1 << 20),
                "max_queued_bytes": max(capacity * prompt_bytes, 1 << 28),
                "max_queued_bytes_per_user": max(math.ceil(capacity / users) * prompt_bytes, 1 << 25),
                "gate": {"waiting_target": waiting_target, "stale_after_seconds": 3600.0},
                "backends": [{"name": "sim-0", "kind": "vllm", "url": engine_url, "scrape_interval_seconds": 0.2}],
            }
        ],
    }
    return validated_toml(config)


async def model_state(stub: pb_grpc.SchedulerServiceStub) -> pb.ModelQueueState:
    response = await cast(
        "grpc.aio.UnaryUnaryCall[pb.GetQueueStateRequest, pb.GetQueueStateResponse]",
        stub.GetQueueState(pb.GetQueueStateRequest(model=MODEL), metadata=(("x-user-id", "bench"),)),
    )
    return response.models[0]


def scheduler_counters(metrics_text: str) -> dict[str, float]:
    """Dispatched and outcome counters from the scheduler's own /metrics."""
    samples = MetricSamples.parse(metrics_text)
    counters = {"dispatched": samples.total("llmsched_requests_dispatched_total") or 0.0}
    for outcome in ("cancelled", "completed", "failed", "expired"):
        counters[outcome] = samples.total("llmsched_request_outcomes_total", outcome=outcome) or 0.0
    return counters


async def wait_queued(stub: pb_grpc.SchedulerServiceStub, count: int, timeout: float) -> float:
    async def reached() -> bool:
        state = await model_state(stub)
        if state.running:
            raise RuntimeError(f"the scheduler dispatched {state.running} request(s): the gate was not closed")
        return state.queued == count

    return await wait_until(reached, f"{count} queued in the scheduler", timeout)


# -- the clients --------------------------------------------------------------------------------------------


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


def _prompt(args: argparse.Namespace) -> str:
    """The prompt every call sends: the short default, or `--prompt-bytes` of ASCII."""
    return "x" * args.prompt_bytes if args.prompt_bytes else PROMPT


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=20000, help="N: calls held queued (default: %(default)s)")
    parser.add_argument("--unary", action="store_true", help="hold Submit calls instead of Stream calls")
    parser.add_argument("--users", type=int, default=100, help="users the calls are spread over (%(default)s)")
    parser.add_argument("--channels", type=int, default=1, help="gRPC channels the calls share (%(default)s)")
    parser.add_argument(
        "--pace",
        type=int,
        default=500,
        help="most calls opening at once, not yet queued (%(default)s; 0: all at once, see the module docstring)",
    )
    parser.add_argument("--warmup", type=int, default=200, help="calls opened and cancelled first (%(default)s)")
    parser.add_argument("--rounds", type=int, default=1, help="open/cancel rounds, to see memory come back or not")
    parser.add_argument("--hold-seconds", type=float, default=3.0, help="window for RSS and CPU while held")
    parser.add_argument(
        "--update-interval",
        type=float,
        default=1.0,
        help="the scheduler's queue_update_interval_seconds (%(default)s, its default)",
    )
    parser.add_argument("--waiting-target", type=int, default=3, help="the gate's engine waiting target")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds allowed for each wait")
    parser.add_argument(
        "--prompt-bytes", type=int, default=0, help="send prompts of this many ASCII bytes (0: a short prompt)"
    )
    args = parser.parse_args(argv)
    if (
        min(args.streams, args.users, args.channels, args.rounds, args.waiting_target) < 1
        or min(args.warmup, args.pace) < 0
    ):
        parser.error("counts must be positive")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())

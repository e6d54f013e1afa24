"""The scheduler's CPU per streamed token, on each event loop (`server.event_loop`), side by side.

Why: every streamed token costs the scheduler an engine read (aiohttp, SSE, JSON) and a client write (a
gRPC message), and on a CPU host those cycles come out of the engine's, on a GPU host out of the engine
front end's core. This measures the whole scheduler process's CPU time (user + system from /proc) while
`--streams` gRPC streams of `--tokens` tokens each run through it from a `llmsched sim` engine (vLLM API,
`--slots` slots), and divides by the tokens streamed. Each round starts one scheduler per event loop, in
an order that alternates between rounds, against the same engine; the report gives each loop's median
and range over the rounds and the ratio of the medians.

With `--read-interval S`, the setups are instead the shipped loop reading every token as it arrives
against the same loop reading a long answer at most every S seconds (`server.stream_read_interval_seconds`,
past `server.stream_read_after_tokens`).

    .venv/bin/python -m bench.tools.stream_cpu                       # 3 rounds, 32 streams x 256 tokens
    .venv/bin/python -m bench.tools.stream_cpu --rounds 5 --streams 64
    .venv/bin/python -m bench.tools.stream_cpu --read-interval 0.02  # paced reads against every token
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from typing import cast

import grpc

from bench import harness
from bench.configs import scheduler_config, validated_toml
from bench.product import EVENT_LOOPS
from clients import pb, pb_grpc

MODEL = "m"


async def _stream(stub: pb_grpc.SchedulerServiceStub, user: str, tokens: int) -> tuple[int, int]:
    """One stream to its end; the tokens it carried and the delta messages that carried them."""
    params = pb.GenerationParams(model=MODEL, prompt="hello world", max_tokens=tokens, ignore_eos=True)
    call = cast(
        "grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]",
        stub.Stream(pb.StreamRequest(params=params), metadata=(("x-user-id", user),)),
    )
    carried = messages = 0
    async for event in call:
        if event.HasField("delta"):
            carried += event.delta.tokens
            messages += 1
    return carried, messages


async def cpu_per_token(
    engine_url: str, server: dict[str, object], streams: int, tokens: int, slots: int
) -> dict[str, float]:
    """Start a scheduler with the `server` settings, warm it up, then stream and measure: microseconds of
    its CPU per token, and the delta messages a stream carried on average."""
    config = scheduler_config(engine_url=engine_url, model=MODEL, engine_model=MODEL, max_num_seqs=slots)
    config["server"].update(server)
    async with (
        harness.scheduler_process(validated_toml(config)) as scheduler,
        grpc.aio.insecure_channel(scheduler.target) as channel,
    ):
        stub = pb_grpc.SchedulerServiceStub(channel)
        await asyncio.gather(*(_stream(stub, f"u{i % 8}", 16) for i in range(8)))  # first-use costs
        cpu, start = scheduler.cpu_seconds(), time.monotonic()
        runs = await asyncio.gather(*(_stream(stub, f"u{i % 8}", tokens) for i in range(streams)))
        cpu, wall = scheduler.cpu_seconds() - cpu, time.monotonic() - start
    carried, messages = sum(run[0] for run in runs), sum(run[1] for run in runs)
    if carried != streams * tokens:
        raise RuntimeError(f"{server}: {carried} tokens streamed, expected {streams * tokens}")
    return {
        "us_per_token": 1e6 * cpu / carried,
        "cpu_seconds": cpu,
        "seconds": wall,
        "tokens": carried,
        "messages_per_stream": messages / streams,
    }


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--read-interval", type=float, default=0.0, help="compare paced reads (seconds) instead")
    args = parser.parse_args(argv)
    setups: dict[str, dict[str, object]]
    if args.read_interval:
        setups = {
            "every token": {"stream_read_interval_seconds": 0.0},
            f"paced {args.read_interval * 1000:g} ms": {"stream_read_interval_seconds": args.read_interval},
        }
    else:  # the event loops, each reading every token
        setups = {loop: {"event_loop": loop, "stream_read_interval_seconds": 0.0} for loop in reversed(EVENT_LOOPS)}
    results: dict[str, list[float]] = {name: [] for name in setups}
    flags = ("--max-num-seqs", str(args.slots), "--decode-base-ms", "8", "--decode-per-seq-ms", "0.2")
    async with harness.simulator(*flags, "--model-name", MODEL) as url:
        for round_no in range(args.rounds):
            order = list(setups) if round_no % 2 == 0 else list(reversed(setups))
            for name in order:
                run = await cpu_per_token(url, setups[name], args.streams, args.tokens, args.slots)
                results[name].append(run["us_per_token"])
                print(
                    f"round {round_no + 1} {name:12s}: {run['us_per_token']:6.0f} us of scheduler CPU per token "
                    f"({run['cpu_seconds']:.2f} s CPU, {run['tokens']:.0f} tokens in {run['seconds']:.1f} s, "
                    f"{run['messages_per_stream']:.0f} delta messages a stream)",
                    flush=True,
                )
    medians = {name: statistics.median(values) for name, values in results.items()}
    for name, values in results.items():
        print(f"{name:12s}: median {medians[name]:.0f} us/token (range {min(values):.0f}-{max(values):.0f})")
    base, other = list(setups)
    print(f"{other} / {base}: {medians[other] / medians[base]:.2f}x the CPU per streamed token")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))

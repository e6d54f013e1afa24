"""The scheduler's CPU per streamed token, on each event loop (`server.event_loop`), side by side.

Why: every streamed token costs the scheduler an engine read (aiohttp, SSE, JSON) and a client write (a
gRPC message), and on a CPU host those cycles come out of the engine's, on a GPU host out of the engine
front end's core. This measures the whole scheduler process's CPU time (user + system from /proc) while
`--streams` gRPC streams of `--tokens` tokens each run through it from a `llmsched sim` engine (vLLM API,
`--slots` slots), and divides by the tokens streamed. Each round starts one scheduler per event loop, in
an order that alternates between rounds, against the same engine; the report gives each loop's median
and range over the rounds and the ratio of the medians.

    .venv/bin/python -m bench.stream_cpu                       # 3 rounds, 32 streams x 256 tokens
    .venv/bin/python -m bench.stream_cpu --rounds 5 --streams 64
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
from clients import pb, pb_grpc
from scheduler_svc.event_loop import EVENT_LOOPS

MODEL = "m"


async def _stream(stub: pb_grpc.SchedulerServiceStub, user: str, tokens: int) -> int:
    """One stream to its end; the tokens it carried (delta messages may carry several)."""
    params = pb.GenerationParams(model=MODEL, prompt="hello world", max_tokens=tokens, ignore_eos=True)
    call = cast(
        "grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]",
        stub.Stream(pb.StreamRequest(params=params), metadata=(("x-user-id", user),)),
    )
    carried = 0
    async for event in call:
        if event.HasField("delta"):
            carried += event.delta.tokens
    return carried


async def cpu_per_token(engine_url: str, event_loop: str, streams: int, tokens: int, slots: int) -> dict[str, float]:
    """Start a scheduler on `event_loop`, warm it up, then stream and measure: microseconds of its CPU per token."""
    config = scheduler_config(engine_url=engine_url, model=MODEL, engine_model=MODEL, max_num_seqs=slots)
    config["server"]["event_loop"] = event_loop
    async with (
        harness.scheduler_process(validated_toml(config)) as scheduler,
        grpc.aio.insecure_channel(scheduler.target) as channel,
    ):
        stub = pb_grpc.SchedulerServiceStub(channel)
        await asyncio.gather(*(_stream(stub, f"u{i % 8}", 16) for i in range(8)))  # first-use costs
        cpu, start = scheduler.cpu_seconds(), time.monotonic()
        carried = sum(await asyncio.gather(*(_stream(stub, f"u{i % 8}", tokens) for i in range(streams))))
        cpu, wall = scheduler.cpu_seconds() - cpu, time.monotonic() - start
    if carried != streams * tokens:
        raise RuntimeError(f"{event_loop}: {carried} tokens streamed, expected {streams * tokens}")
    return {"us_per_token": 1e6 * cpu / carried, "cpu_seconds": cpu, "seconds": wall, "tokens": carried}


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--slots", type=int, default=16)
    args = parser.parse_args(argv)
    results: dict[str, list[float]] = {loop: [] for loop in EVENT_LOOPS}
    flags = ("--max-num-seqs", str(args.slots), "--decode-base-ms", "8", "--decode-per-seq-ms", "0.2")
    async with harness.simulator(*flags, "--model-name", MODEL) as url:
        for round_no in range(args.rounds):
            order = EVENT_LOOPS if round_no % 2 == 0 else tuple(reversed(EVENT_LOOPS))
            for loop in order:
                run = await cpu_per_token(url, loop, args.streams, args.tokens, args.slots)
                results[loop].append(run["us_per_token"])
                print(
                    f"round {round_no + 1} {loop:8s}: {run['us_per_token']:6.0f} us of scheduler CPU per token "
                    f"({run['cpu_seconds']:.2f} s CPU, {run['tokens']:.0f} tokens in {run['seconds']:.1f} s)",
                    flush=True,
                )
    medians = {loop: statistics.median(values) for loop, values in results.items()}
    for loop, values in results.items():
        print(f"{loop:8s}: median {medians[loop]:.0f} us/token (range {min(values):.0f}-{max(values):.0f})")
    print(f"uvloop / asyncio: {medians['uvloop'] / medians['asyncio']:.2f}x the CPU per streamed token")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))

"""Scenario S1, side by side: a 200-request flood from one user, then two latecomers.

Runs the same workload twice against a fresh simulated vLLM engine (continuous batching, FIFO queue):
once with every client talking to the engine directly, once through llm-scheduler. Prints each
latecomer's time to first token, the idle-engine TTFT for reference, and the engine's output tokens/s
over the same window of the flood, so the ratios come from one run on one machine.

    python -m bench.s1_demo [--flood 200] [--tokens 200] [--max-num-seqs 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass

import aiohttp
import grpc

from bench import harness
from clients import pb_grpc

MODEL = "sim-model"
TOKENS_METRIC = "vllm:generation_tokens_total"

SCHEDULER_CONFIG = """
[server]
listen = "127.0.0.1:{{GRPC_PORT}}"
metrics_listen = ""
log_level = "warning"

[[models]]
name = "{model}"
max_tokens_limit = 4096

[models.gate]
waiting_target = 3

[[models.backends]]
name = "sim-vllm"
kind = "vllm"
url = "{url}"
scrape_interval_seconds = 0.1
"""


@dataclass
class RunResult:
    mode: str
    idle_ttft: float
    latecomer_ttft: dict[str, float]
    tokens_per_second: float


async def _run(mode: str, args: argparse.Namespace) -> RunResult:
    sim_flags = [
        "--max-num-seqs", str(args.max_num_seqs),
        "--decode-base-ms", str(args.decode_base_ms),
        "--decode-per-seq-ms", str(args.decode_per_seq_ms),
    ]  # fmt: skip
    async with (
        harness.simulator(*sim_flags) as url,
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        ) as session,
    ):
        if mode == "direct":

            async def ttft(user: str) -> float:
                return await harness.direct_ttft(session, url, MODEL, f"{user} asks", args.tokens)

            async def complete(user: str, i: int) -> None:
                await harness.direct_complete(session, url, MODEL, f"{user} request {i}", args.tokens)

            return await _scenario(mode, url, ttft, complete, args)
        config = SCHEDULER_CONFIG.format(model=MODEL, url=url)
        async with harness.scheduler(config) as target, grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.SchedulerServiceStub(channel)

            async def ttft(user: str) -> float:
                return await harness.scheduled_ttft(stub, user, MODEL, f"{user} asks", args.tokens)

            async def complete(user: str, i: int) -> None:
                await harness.scheduled_complete(stub, user, MODEL, f"{user} request {i}", args.tokens)

            return await _scenario(mode, url, ttft, complete, args)


async def _scenario(mode, url, ttft, complete, args) -> RunResult:  # type: ignore[no-untyped-def]
    idle = await ttft("idle-probe")
    flood = [asyncio.create_task(complete("A", i)) for i in range(args.flood)]
    try:
        await asyncio.sleep(args.latecomer_delay)  # the scenario: latecomers arrive a little later
        tokens_before, t0 = await harness.engine_counter(url, TOKENS_METRIC), time.monotonic()
        late = await asyncio.gather(ttft("B"), ttft("C"))
        remaining = args.window - (time.monotonic() - t0)
        if remaining > 0:
            await asyncio.sleep(remaining)  # measure throughput over a fixed window of the flood
        tokens_after, t1 = await harness.engine_counter(url, TOKENS_METRIC), time.monotonic()
    finally:
        for task in flood:
            task.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
    return RunResult(mode, idle, {"B": late[0], "C": late[1]}, (tokens_after - tokens_before) / (t1 - t0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flood", type=int, default=200, help="requests user A sends at once")
    parser.add_argument("--tokens", type=int, default=200, help="output tokens per request")
    parser.add_argument("--max-num-seqs", type=int, default=16, help="engine batch slots")
    parser.add_argument("--decode-base-ms", type=float, default=3.0)
    parser.add_argument("--decode-per-seq-ms", type=float, default=0.25)
    parser.add_argument("--latecomer-delay", type=float, default=1.0, help="seconds after the flood")
    parser.add_argument("--window", type=float, default=8.0, help="throughput window in seconds")
    parser.add_argument("--json", help="also write the raw figures to this file")
    args = parser.parse_args()

    direct = asyncio.run(_run("direct", args))
    scheduled = asyncio.run(_run("scheduled", args))
    request_time = args.tokens * (args.decode_base_ms + args.decode_per_seq_ms * args.max_num_seqs) / 1000
    print(
        f"\nS1: user A floods {args.flood} x {args.tokens}-token requests; B and C send one each "
        f"{args.latecomer_delay:.0f}s later. Engine: simulated vLLM, {args.max_num_seqs} slots, FIFO.\n"
    )
    print(f"| {'figure':<32} | {'direct':>9} | {'scheduled':>9} | {'direct/scheduled':>16} |")
    print(f"|{'-' * 34}|{'-' * 11}|{'-' * 11}|{'-' * 18}|")
    print(f"| {'idle-engine TTFT (s)':<32} | {direct.idle_ttft:9.3f} | {scheduled.idle_ttft:9.3f} | {'':>16} |")
    for user in ("B", "C"):
        d, s = direct.latecomer_ttft[user], scheduled.latecomer_ttft[user]
        print(f"| {'latecomer ' + user + ' TTFT (s)':<32} | {d:9.3f} | {s:9.3f} | {d / s:15.1f}x |")
    d, s = direct.tokens_per_second, scheduled.tokens_per_second
    print(f"| {'engine output tokens/s (flood)':<32} | {d:9.0f} | {s:9.0f} | {d / s:16.2f} |")
    bound = 2 * direct.idle_ttft + request_time
    worst = max(scheduled.latecomer_ttft.values())
    print(
        f"\nTarget (S1, docs/benchmarks.md): scheduled latecomer TTFT <= 2 x idle TTFT + one request's decode time "
        f"= {bound:.2f}s -> worst {worst:.2f}s: {'met' if worst <= bound else 'NOT met'}; "
        f"engine throughput scheduled/direct = {s / d:.1%} (S2 target >= 95%)."
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"direct": asdict(direct), "scheduled": asdict(scheduled), "args": vars(args)}, f, indent=2)


if __name__ == "__main__":
    main()

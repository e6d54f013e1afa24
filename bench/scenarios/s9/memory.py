"""S9 (c): the core's resident memory with many requests queued.

In a fresh process (`python -m bench.scenarios.s9.memory`, which imports the core alone, so nothing else is
resident: no gRPC, protobuf, tracing or Redis library, which the core never loads): the core of one
model on 100 backends (vtc, `prefix_locality`), every engine shown full so nothing goes; then `requests`
calls from `users` users, each with its own prompt of `prompt_bytes` ASCII characters, admitted and queued.
Resident memory (VmRSS) is read before the first call and after the last, after a full garbage
collection each time; what a queued request holds beyond its prompt is the growth over the requests less
the prompt's bytes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.product_core import SteppedCore, configure_logging, load_config
from bench.scenarios.s9.core_config import MODEL, config


@dataclass(frozen=True)
class MemoryParams:
    requests: int = 100_000
    users: int = 10_000
    prompt_bytes: int = 1024
    backends: int = 100


QUICK = MemoryParams(requests=5_000, users=500, backends=10)


@dataclass
class Memory:
    requests: int
    users: int
    prompt_bytes: int
    rss_before: int  # bytes, the core built and nothing queued
    rss_after: int  # bytes, every request queued
    bytes_per_request: float  # growth over the requests
    bytes_beyond_prompt: float  # of that, beyond the prompt's own bytes


def resident_bytes() -> int:
    for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def prompt(user: int, serial: int, size: int) -> str:
    head = f"user {user} request {serial}: "
    return head + "q" * (size - len(head))


def measure(p: MemoryParams) -> Memory:
    """In this process (see the module docstring)."""
    core = SteppedCore(load_config(config(p.backends, "vtc", "signals", 0.0)))
    for i in range(p.backends):
        core.reading(MODEL, f"b{i}", waiting=100, running=8, tpot_seconds=0.02)
    core.settle()
    gc.collect()
    before = resident_bytes()
    for serial in range(p.requests):
        user = serial % p.users
        core.admit(model=MODEL, user=f"u{user}", prompt=prompt(user, serial, p.prompt_bytes), max_tokens=16)
    assert core.settle() == [], "the engines are full: nothing goes"
    gc.collect()
    after = resident_bytes()
    per_request = (after - before) / p.requests
    return Memory(p.requests, p.users, p.prompt_bytes, before, after, per_request, per_request - p.prompt_bytes)


def measure_apart(p: MemoryParams) -> Memory:
    """`measure` in a fresh interpreter, whose resident memory is this core's alone."""
    command = [sys.executable, "-m", "bench.scenarios.s9.memory", "--json", "--requests", str(p.requests)]
    command += ["--users", str(p.users), "--prompt-bytes", str(p.prompt_bytes), "--backends", str(p.backends)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return Memory(**json.loads(out.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = MemoryParams()
    parser.add_argument("--requests", type=int, default=defaults.requests)
    parser.add_argument("--users", type=int, default=defaults.users)
    parser.add_argument("--prompt-bytes", type=int, default=defaults.prompt_bytes)
    parser.add_argument("--backends", type=int, default=defaults.backends)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    configure_logging("error")
    memory = measure(MemoryParams(args.requests, args.users, args.prompt_bytes, args.backends))
    if args.json:
        print(json.dumps(asdict(memory)))
    else:
        print(
            f"{memory.requests} queued from {memory.users} users: RSS {memory.rss_after / 2**20:.0f} MiB "
            f"(before {memory.rss_before / 2**20:.0f} MiB), {memory.bytes_per_request:.0f} B per request, "
            f"{memory.bytes_beyond_prompt:.0f} B beyond its {memory.prompt_bytes} B prompt"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

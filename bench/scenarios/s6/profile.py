"""S6 under a profiler (`--profile`): one more fixed-rate run with the scheduler under pyinstrument, and where
its time went: own time per function and per area.

pyinstrument's flat view merges every "[self]" entry into one line and counts start-up imports and the
idle `epoll` wait as work. The summary charges a frame's own time to the function itself, leaves out
import-time frames and the idle poll, and groups the rest by area (gRPC's C core, aiohttp, asyncio's loop,
our adapters, the scheduler, Prometheus, JSON), so "what dominates" reads off directly. A saved session is
summarised again with `python -m bench.tools.profile_summary FILE`.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bench.engines import EngineProvider
from bench.runner import Mode, RunContext, run_modes
from bench.scenarios.s6.setups import PROFILED, S6Params, config
from bench.scenarios.s6.workload import fixed_rate

IDLE = {"epoll.poll", "select", "EpollSelector.select"}
AREAS = (
    ("Context.run", "gRPC aio (Cython/C core: calls, messages, completion queue)"),
    ("grpc", "gRPC aio (Cython/C core: calls, messages, completion queue)"),
    ("aiohttp/", "aiohttp (HTTP client to the engine, SSE line reading)"),
    ("asyncio/", "asyncio event loop (callbacks, tasks, futures)"),
    ("selectors", "asyncio event loop (callbacks, tasks, futures)"),
    ("backends/", "engine adapter (backends/: SSE parsing, TextDelta)"),
    ("scheduler_svc/", "scheduler (scheduler_svc/: servicer, ticket, dispatcher, admission)"),
    ("prometheus_client/", "Prometheus client (labels(), inc(), observe())"),
    ("json/", "json"),
    ("loads", "json"),
    ("socket.", "sockets"),
    ("google/protobuf", "protobuf"),
    ("structlog", "logging"),
    ("logging/", "logging"),
)


def _key(frame: Any) -> str:
    return f"{frame.function}  {frame.file_path_short}:{frame.line_no}"


def _area(key: str) -> str:
    return next((area for marker, area in AREAS if marker in key), "other")


def own_times(session_path: Path) -> Counter[str]:
    """Own (self) seconds per function while the scheduler was busy, imports and idle polling excluded."""
    from pyinstrument.session import Session

    own: Counter[str] = Counter()

    def walk(frame: Any, owner: str) -> None:
        if frame.function in ("_find_and_load", "_call_with_frames_removed"):
            return  # import time: start-up, not the hot path
        key = owner if frame.function.startswith("[self]") else _key(frame)
        own[key] += frame.time - sum(child.time for child in frame.children)
        for child in frame.children:
            walk(child, key)

    walk(Session.load(str(session_path)).root_frame(), "root")
    for key in [k for k in own if k.split("  ")[0] in IDLE]:
        del own[key]
    return own


def summarize(session_path: Path, top: int = 25) -> str:
    own = own_times(session_path)
    busy = sum(own.values()) or 1.0
    areas: Counter[str] = Counter()
    for key, seconds in own.items():
        areas[_area(key)] += seconds
    lines = [f"Busy time sampled: {busy:.2f} s (idle polling and start-up imports left out)", "", "By area:"]
    lines += [f"  {seconds / busy:6.1%}  {seconds:7.3f} s  {area}" for area, seconds in areas.most_common()]
    lines += ["", f"Top {top} functions by own time:"]
    lines += [f"  {seconds / busy:6.1%}  {seconds:7.3f} s  {key}" for key, seconds in own.most_common(top)]
    return "\n".join(lines) + "\n"


async def profiled(provider: EngineProvider, p: S6Params, out_dir: Path) -> list[str]:
    """One more fixed-rate run with the scheduler under pyinstrument; returns the files written."""
    session = out_dir / "s6_profile.pyisession"
    wrapper = [sys.executable, "-m", "pyinstrument", "-r", "pyisession", "-o", str(session)]

    async def body(run: RunContext) -> None:
        await fixed_rate(run, p, p.rate, min(p.duration, 3.0), "profile")  # profiled, it saturates sooner
        await run.wait_all(p.timeout)

    modes = [Mode(PROFILED, config=config)]
    await run_modes(provider, modes, body, timeout=p.duration + p.timeout, scheduler_wrapper=wrapper)
    tree = out_dir / "s6_profile.txt"
    command = [sys.executable, "-m", "pyinstrument", f"--load={session}", "-r", "text", "--no-color"]
    rendered = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=120)
    tree.write_text(rendered.stdout)
    summary = out_dir / "s6_profile_summary.txt"
    summary.write_text(await asyncio.to_thread(summarize, session))
    return [tree.name, summary.name, session.name]

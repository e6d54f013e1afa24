"""The processes the benchmarks start: the simulator, the scheduler, the instant fake engine and the gRPC echo,
each a real subprocess of this checkout's code, ready once it answers and stopped afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc

from bench.product import SERVICE_COMMAND
from engines import free_port

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Proc:
    """A child process with its log file."""

    popen: subprocess.Popen[bytes]
    log_path: Path

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def spawn(args: Sequence[str], name: str, root: Path = ROOT) -> Proc:
    """Run `args` on the code under `root` (this checkout's; a bench comparing with an earlier version gives
    that version's tree), whatever the installed package points at."""
    log_dir = Path(tempfile.gettempdir()) / "llmsched-bench"
    log_dir.mkdir(exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log = log_path.open("wb")
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    popen = subprocess.Popen(list(args), stdout=log, stderr=subprocess.STDOUT, cwd=root, env=env)
    return Proc(popen, log_path)


async def wait_http(url: str, proc: Proc, timeout: float = 60.0) -> None:
    """Wait until `url` answers 200 (the process must stay alive meanwhile)."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"process exited early; see {proc.log_path}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)  # polling a child process for readiness: no event to wait on
    raise TimeoutError(f"{url} not ready after {timeout}s; see {proc.log_path}")


async def wait_until(check: Callable[[], Awaitable[bool]], what: str, timeout: float, interval: float = 0.1) -> float:
    """Poll `check` until it holds; returns the seconds it took. Polling is how one watches another process."""
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not reached after {timeout:.0f}s")
        await asyncio.sleep(interval)
    return time.monotonic() - start


async def wait_grpc(target: str, proc: Proc, timeout: float = 30.0) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout)
        except TimeoutError:
            raise TimeoutError(f"scheduler at {target} not ready; see {proc.log_path}") from None


@asynccontextmanager
async def simulator(*flags: str) -> AsyncIterator[str]:
    """A `llmsched sim` subprocess; yields its base URL."""
    port = free_port()
    async with _http_process([*SERVICE_COMMAND, "sim", "--port", str(port), *flags], port, f"sim-{port}") as url:
        yield url


@asynccontextmanager
async def _http_process(argv: Sequence[str], port: int, name: str) -> AsyncIterator[str]:
    """Run an HTTP server process listening on `port`, ready once its /health answers; stopped on exit."""
    proc = spawn(argv, name)
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_http(url + "/health", proc)
        yield url
    finally:
        proc.stop()


@dataclass
class SchedulerProc:
    """A running scheduler subprocess: its gRPC target, its process (for CPU accounting) and, when its config
    opens the OpenAI-compatible HTTP door, that door's base URL."""

    target: str
    proc: Proc
    http_url: str = ""
    metrics_url: str = ""  # when its config opens the metrics port

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.popen.pid)


@asynccontextmanager
async def scheduler_process(
    config_toml: str, wrapper: Sequence[str] = (), root: Path = ROOT
) -> AsyncIterator[SchedulerProc]:
    """A `llmsched serve` subprocess for the config (`{GRPC_PORT}`, `{HTTP_PORT}` and `{METRICS_PORT}` are filled
    in), optionally run under `wrapper` (a profiler's command line ending where the module arguments start), on
    the code under `root`. Ready once gRPC answers and, with the HTTP door open, once the door's /readyz does
    too."""
    port = free_port()
    text = config_toml.replace("{GRPC_PORT}", str(port))
    http_port = free_port() if "{HTTP_PORT}" in text else None
    text = text.replace("{HTTP_PORT}", str(http_port))
    metrics_port = free_port() if "{METRICS_PORT}" in text else None
    text = text.replace("{METRICS_PORT}", str(metrics_port))
    path = Path(tempfile.gettempdir()) / "llmsched-bench" / f"scheduler-{port}.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    command = [*wrapper, *SERVICE_COMMAND[1:]] if wrapper else [*SERVICE_COMMAND]
    argv = [*command, "serve", "--config", str(path)]
    async with _grpc_process(argv, port, root=root) as proc:
        if http_port is not None:
            proc.http_url = f"http://127.0.0.1:{http_port}"
            await wait_http(proc.http_url + "/readyz", proc.proc)
        if metrics_port is not None:
            proc.metrics_url = f"http://127.0.0.1:{metrics_port}"
        yield proc


@asynccontextmanager
async def grpc_echo() -> AsyncIterator[SchedulerProc]:
    """`bench.servers.grpc_echo`: a bare gRPC streaming echo laid out like the scheduler (its own process)."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.servers.grpc_echo", "--port", str(port)]
    async with _grpc_process(argv, port, "echo") as proc:
        yield proc


@asynccontextmanager
async def _grpc_process(
    argv: Sequence[str], port: int, name: str = "scheduler", root: Path = ROOT
) -> AsyncIterator[SchedulerProc]:
    """Run a gRPC server process listening on `port`, ready once it answers; stopped on exit."""
    proc = spawn(argv, f"{name}-{port}", root)
    try:
        target = f"127.0.0.1:{port}"
        await wait_grpc(target, proc)
        yield SchedulerProc(target, proc)
    finally:
        proc.stop()


@asynccontextmanager
async def fake_engine(tokens: int) -> AsyncIterator[str]:
    """`bench.servers.fake_engine`: answers every completion at once with `tokens` tokens; yields its base URL."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.servers.fake_engine", "--port", str(port), "--tokens", str(tokens)]
    async with _http_process(argv, port, f"fake-{port}") as url:
        yield url


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc), children excluded."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

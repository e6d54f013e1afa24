"""One engine server as a child process: start it, wait until it is ready, stop, kill and restart it.

An :class:`EngineProcess` is a command line bound to a fixed loopback port (kept across restarts) and run
in its own process group, so that stopping it also stops what it forked (vLLM's engine core). Readiness is
``GET /health`` answering 200; stdout and stderr go to ``<cache>/logs/<name>-<port>.log``, whose tail is
quoted in every :class:`EngineError`. The factories in :mod:`engines.launch` build the command lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from backends.metrics import selected_metrics
from engines.paths import ROOT, cache


class EngineError(RuntimeError):
    """An engine is not installed, did not become ready, or died."""


_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now, below the kernel's ephemeral range and never the same
    one twice in this process. A port the kernel hands out for bind(0) may be taken as the source port of
    some outgoing connection (another server's, connecting to Redis or an engine) between choosing it and
    the server binding it, or while a server restarts on it; below the range no connection gets it."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    candidates = range(max(1024, low - 10_000), low)
    for port in random.sample(candidates, min(200, len(candidates))):
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # the low range is taken: the kernel's
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, n: int = 40) -> str:
    """Return the last ``n`` lines of a log file (or a note that it is missing)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(lines[-n:])


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """GET ``url``; return (status, body). Status 0 means no HTTP answer (refused, reset, timeout)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode("utf-8", "replace")
    except (OSError, urllib.error.URLError):
        return 0, ""


@dataclass
class EngineProcess:
    """One engine subprocess bound to a fixed loopback port (kept across restarts).

    ``argv`` is the full command line (it already contains the port). ``metrics_text()`` is
    synchronous (urllib); ``ametrics_text()`` is its asyncio wrapper.
    """

    name: str
    argv: list[str]
    port: int
    served_model_name: str
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout: float = 120.0
    host: str = "127.0.0.1"
    log_path: Path = field(init=False)
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    last_startup_s: float | None = field(default=None, init=False)
    # Called once the engine answers /health, at every start and restart (its processes are new each time):
    # :func:`engines.layout.lay_out` pins them here.
    on_ready: Callable[[EngineProcess], object] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        """Derive the log file path."""
        logs = cache().logs
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"{self.name}-{self.port}.log"

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8123`` (no trailing slash, no ``/v1``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """PID of the engine's main process (also its process group id), or None."""
        return self.proc.pid if self.proc else None

    def is_running(self) -> bool:
        """True while the main process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float | None = None) -> EngineProcess:
        """Launch the process (in a new session) and block until ``/health`` answers 200."""
        if self.is_running():
            raise EngineError(f"{self.name} already running (pid {self.pid})")
        env = {**os.environ, **self.env}
        t0 = time.monotonic()
        with self.log_path.open("ab") as log:
            log.write(f"\n===== {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                cwd=str(ROOT),
            )
        try:
            self.wait_ready(timeout if timeout is not None else self.startup_timeout)
            if self.on_ready is not None:
                self.on_ready(self)
        except BaseException:
            self.stop()
            raise
        self.last_startup_s = time.monotonic() - t0
        return self

    def wait_ready(self, timeout: float) -> None:
        """Poll ``GET /health`` until 200; raise EngineError (with the log path) on exit or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                rc = None if self.proc is None else self.proc.returncode
                raise EngineError(
                    f"{self.name} exited (rc={rc}) before becoming ready on {self.url}; "
                    f"log: {self.log_path}\n--- log tail ---\n{tail(self.log_path)}"
                )
            status, _ = http_get(self.url + "/health", timeout=2.0)
            if status == 200:
                return
            if time.monotonic() > deadline:
                raise EngineError(
                    f"{self.name} not ready on {self.url}/health after {timeout:.0f}s (last status "
                    f"{status}); log: {self.log_path}\n--- log tail ---\n{tail(self.log_path)}"
                )
            time.sleep(0.25)

    def _signal_group(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the engine's whole process group (vLLM forks an engine-core process)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self, grace: float = 15.0) -> None:
        """Graceful stop: SIGTERM the process group, then SIGKILL after ``grace`` seconds."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        # Children (e.g. vLLM's EngineCore) may outlive the parent: always sweep the group.
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._wait_port_free()

    def kill(self) -> None:
        """Crash the engine: SIGKILL the whole process group at once (open streams are cut)."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._wait_port_free()

    def restart(self, timeout: float | None = None) -> EngineProcess:
        """Stop (if still running) and start again on the SAME port; blocks until ready."""
        if self.is_running():
            self.stop()
        return self.start(timeout)

    async def arestart(self, timeout: float | None = None) -> EngineProcess:
        """Async wrapper of :meth:`restart` (runs it in a worker thread)."""
        return await asyncio.to_thread(self.restart, timeout)

    def ensure_running(self) -> EngineProcess:
        """Restart the engine if a previous user killed it; no-op while it is alive."""
        if not self.is_running():
            self.start()
        return self

    def _wait_port_free(self, timeout: float = 10.0) -> None:
        """Wait until nothing accepts connections on our port any more."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(0.5)
                if s.connect_ex((self.host, self.port)) != 0:
                    return
            time.sleep(0.1)

    def metrics_text(self, timeout: float = 5.0, names: Sequence[str] = ()) -> str:
        """Return the raw Prometheus text of ``GET /metrics`` (raises EngineError if not 200).

        With ``names``, a vLLM engine is asked for those series only (Prometheus' ``name[]`` selection at
        its ``/metrics/`` mount): about 2 KB instead of 50 KB, so a test sampling the gauges often does
        not load the engine's HTTP front end, which also takes in the requests under test. Other engines
        answer in full."""
        url = self.url + "/metrics"
        if names and self.name.startswith("vllm"):
            selected, query = selected_metrics(url, names)
            url = selected + "?" + urllib.parse.urlencode(query)
        status, body = http_get(url, timeout=timeout)
        if status != 200:
            raise EngineError(f"{self.name}: GET /metrics -> {status}; log: {self.log_path}")
        return body

    async def ametrics_text(self, timeout: float = 5.0, names: Sequence[str] = ()) -> str:
        """Async wrapper of :meth:`metrics_text` (runs it in a worker thread)."""
        return await asyncio.to_thread(self.metrics_text, timeout, names)

    def __enter__(self) -> EngineProcess:
        """Start if not running; return self."""
        if not self.is_running():
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the engine."""
        self.stop()
